"""Reusable conformance suites for plugins: run them on your own compressors and strategies.

Example:
    >>> from modelopt.testing.compressors import check_compressor
    >>> check_compressor(MyCompressor())
"""
