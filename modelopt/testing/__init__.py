"""Reusable conformance suites for plugins: run them on your own compressors, strategies and latency engines.

Example:
    >>> from modelopt.testing.compressors import check_compressor
    >>> check_compressor(MyCompressor())
    >>> from modelopt.testing.engines import check_engine
    >>> check_engine(ENGINES.get("tensorrt"), evaluator, [evaluator.space.plan(), w8a8], images)
"""
