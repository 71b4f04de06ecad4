"""``python -m fluidctl`` is the same as the ``fluidctl`` console script."""
from fluidctl.cli import main

if __name__ == "__main__":
    main()
