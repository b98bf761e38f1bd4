"""The examples of the documentation.

Each page includes one of these files; tests/*/test_docs_examples.py runs it.
"""
