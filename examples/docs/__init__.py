"""The examples of the documentation: each page includes one of these files, and tests/*/test_docs_examples.py runs it."""
