"""Data the package ships: the default corpus of `attnviz report` (sentences.txt)."""

from importlib import resources
from pathlib import Path

# Inside the package, so an installed wheel finds it too.
CORPUS = Path(str(resources.files(__name__).joinpath("sentences.txt")))
# How help and messages name it: where it lives in the package, wherever that is installed.
CORPUS_NAME = f"{__name__.replace('.', '/')}/{CORPUS.name}"
