"""Data the package ships: the default corpus of `attnviz report` (sentences.txt), and the
default haystack of `attnviz needle` (haystack.txt: short essays on everyday subjects, written
for attnviz; about 4,300 tokens of SmolLM2, repeated where a longer context is asked for)."""

from importlib import resources
from pathlib import Path

# Inside the package, so an installed wheel finds it too.
CORPUS = Path(str(resources.files(__name__).joinpath("sentences.txt")))
# How help and messages name it: where it lives in the package, wherever that is installed.
CORPUS_NAME = f"{__name__.replace('.', '/')}/{CORPUS.name}"
HAYSTACK = Path(str(resources.files(__name__).joinpath("haystack.txt")))
HAYSTACK_NAME = f"{__name__.replace('.', '/')}/{HAYSTACK.name}"
