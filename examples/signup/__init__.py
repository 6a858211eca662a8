"""The example sign-up suite is a package: its tests import the app as ``.app``, which works
under both of pytest's import modes (``importlib`` puts no test's directory on sys.path)."""
