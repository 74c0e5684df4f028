"""The one place the version of both distributions is written (client/pyproject.toml and
setup.py read it); a module of its own so that the client's modules can name it without
importing the package that imports them."""

__version__ = "0.2.0"
