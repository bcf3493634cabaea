"""Terminal views (rich), one module per command:

show.py     the header, what each head does (the map, the details), one token's view
            (--query), a heatmap in characters, the ablation's effect
check.py    the model against the from-scratch attention
report.py   the heads' roles, induction, syntax and coreference, importance, alignment,
            a report over pictures, a report over pictures and questions
compare.py  what was compared and how far each head moved (texts, pictures, pictures and
            questions)
export.py   what export wrote
needle.py   the needle-in-a-haystack runs, the retrieval heads, their ablation
common.py   the colour ramp and shades, token labels, weights as text, the moved map, where
            a command wrote its images and page
"""

from attnviz.outputs.terminal.check import print_check
from attnviz.outputs.terminal.common import (
    colour,
    print_divergence_map,
    print_written,
    text_colour,
)
from attnviz.outputs.terminal.compare import (
    print_compare,
    print_compare_query,
    print_comparison_header,
    print_moved,
    print_moved_importance,
    print_picture_compare,
)
from attnviz.outputs.terminal.export import print_export
from attnviz.outputs.terminal.needle import print_needle
from attnviz.outputs.terminal.report import (
    print_alignment,
    print_importance,
    print_linguistics,
    print_picture_report,
    print_question_report,
    print_repeats,
    print_report,
    print_seq2seq_report,
)
from attnviz.outputs.terminal.show import (
    print_ablation,
    print_continuation,
    print_head_details,
    print_head_map,
    print_header,
    print_heatmap,
    print_query,
    print_show,
    print_special_share,
)

__all__ = [
    "print_needle",
    "colour",
    "text_colour",
    "print_divergence_map",
    "print_picture_compare",
    "print_header",
    "print_continuation",
    "print_special_share",
    "print_head_map",
    "print_head_details",
    "print_query",
    "print_heatmap",
    "print_ablation",
    "print_show",
    "print_check",
    "print_report",
    "print_repeats",
    "print_alignment",
    "print_linguistics",
    "print_picture_report",
    "print_question_report",
    "print_importance",
    "print_seq2seq_report",
    "print_comparison_header",
    "print_moved",
    "print_compare_query",
    "print_moved_importance",
    "print_compare",
    "print_export",
    "print_written",
]
