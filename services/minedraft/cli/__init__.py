"""Command-line entry points (`minedraft generate`, `minedraft bench`, ...)."""
