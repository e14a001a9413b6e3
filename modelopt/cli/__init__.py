"""The `modelopt` command: a thin typer app over the Python API, its options and its display."""
