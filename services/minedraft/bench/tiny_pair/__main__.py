"""Entry point of `python -m minedraft.bench.tiny_pair`."""

from minedraft.bench.tiny_pair.cli import main

if __name__ == "__main__":
    main()
