"""The pipelines behind the CLI's commands, one module each: show, check, export, report.

`attnviz.cli` parses options and calls these; `attnviz.api` (the notebook API) calls them too.
"""
