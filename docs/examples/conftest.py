"""The docs' examples are tests: `make test` runs every file here."""

# A Django project with its own pytest.ini (DJANGO_SETTINGS_MODULE), as its users have one.
# Django's settings and test environment are global to a process, so tests/test_recipes.py
# runs it in a pytest process of its own (with and without xdist) instead of this one.
collect_ignore = ["django_recipe"]
