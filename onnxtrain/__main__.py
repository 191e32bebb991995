"""``python -m onnxtrain``: see :mod:`onnxtrain.cli`."""
import sys

from .cli import main

sys.exit(main())
