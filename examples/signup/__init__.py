"""The example sign-up suite is a package: its tests import the app as ``.app``, which works
under both of pytest's import modes (``importlib`` puts no test's directory on sys.path)
from pytest 8.2 on; pytest 8.1's ``importlib`` mode imports no package's parent first
(pytest-dev/pytest#12208), so there it needs the default ``prepend`` mode."""
