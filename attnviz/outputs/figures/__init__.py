"""Figures (matplotlib, object API, Agg), built from arrays and labels:

labels.py    what a text's heatmaps say besides the weights (`Labels`), read from its
             Attention once
style.py     what every figure shares: `Style` (format, dpi, colour map, scale), the
             layout of token labels and axes, marks for masked, removed and written cells,
             titles
heatmaps.py  attention heatmaps: one head, a layer's grid of heads, the overview, a query,
             from arrays and `Labels`
report.py    the report's and compare's grids, role maps, relations and differences, and a
             picture report's mean attention distance against depth
questions.py a report over pictures and questions: the picture's share against layer
raster.py    how figures become files fast: a figure drawn once and redrawn per frame
             (blitting, cells painted as whole pixels), PNG encoding, atomic saving
"""

from attnviz.outputs.figures.heatmaps import (
    OVERVIEW_MASKED,
    HeadFigure,
    LayerFigure,
    OverviewFigure,
    head_title,
    overview_figure,
    overview_mosaic,
    query_figure,
    query_rows,
)
from attnviz.outputs.figures.labels import Labels
from attnviz.outputs.figures.questions import share_figure
from attnviz.outputs.figures.raster import figure_png, save_figure
from attnviz.outputs.figures.report import (
    DIFFERENCE_LABEL,
    MetricGrid,
    difference_figure,
    distance_figure,
    divergence_figure,
    importance_figure,
    moved_or_matters_figure,
    relation_figure,
    role_map_figure,
)
from attnviz.outputs.figures.style import (
    FORMATS,
    LABEL_STEPS,
    MASKED_GREY,
    MASKED_HATCH_COLOUR,
    MASKED_NOTE,
    REMOVED_HATCH_COLOUR,
    REMOVED_NOTE,
    SCALES,
    Layout,
    Style,
    check_cmap,
    configure_matplotlib,
    context_line,
    fixed_axes,
    ordinal,
)

__all__ = [
    "share_figure",
    "Labels",
    "FORMATS",
    "LABEL_STEPS",
    "Layout",
    "MASKED_GREY",
    "MASKED_HATCH_COLOUR",
    "MASKED_NOTE",
    "REMOVED_HATCH_COLOUR",
    "REMOVED_NOTE",
    "SCALES",
    "Style",
    "check_cmap",
    "configure_matplotlib",
    "context_line",
    "ordinal",
    "figure_png",
    "fixed_axes",
    "save_figure",
    "HeadFigure",
    "LayerFigure",
    "OVERVIEW_MASKED",
    "OverviewFigure",
    "head_title",
    "overview_figure",
    "overview_mosaic",
    "query_figure",
    "query_rows",
    "DIFFERENCE_LABEL",
    "MetricGrid",
    "difference_figure",
    "distance_figure",
    "divergence_figure",
    "importance_figure",
    "moved_or_matters_figure",
    "relation_figure",
    "role_map_figure",
]
