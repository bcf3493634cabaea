"""Data the package ships: the default corpus of `attnviz report` (sentences.txt)."""
