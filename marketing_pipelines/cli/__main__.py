"""``python -m marketing_pipelines.cli``: the same command as ``marketing-pipelines``."""

from marketing_pipelines.cli import main

if __name__ == "__main__":
    main()
