"""The `attnviz` command line: one module per command, each parsing its options, calling one
pipeline and rendering the result; `app` holds what they share.

COMMANDS is the one list of command modules, in the order `attnviz --help` shows them;
adding a command is one module that registers on `app` and one name here.
"""

from importlib import import_module

from attnviz.cli.app import app, main

COMMANDS = ("show", "check", "export", "report")
for _name in COMMANDS:
    import_module(f"attnviz.cli.{_name}")

__all__ = ["COMMANDS", "app", "main"]
