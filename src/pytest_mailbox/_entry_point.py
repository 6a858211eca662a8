"""The ``pytest11`` entry point ``mailbox``: it loads ``pytest_mailbox.plugin`` by that
module's own name, so a project that names the module too (``pytest_plugins =
["pytest_mailbox.plugin"]`` in a conftest, ``-p pytest_mailbox.plugin``: what a run with
``PYTEST_DISABLE_PLUGIN_AUTOLOAD`` needs) loads it once, where pytest refused to register
one module under two names. ``-p no:mailbox`` still turns the plugin off, ``-p mailbox``
on.

PYTEST_DONT_REWRITE, as the package says.
"""

pytest_plugins = ["pytest_mailbox.plugin"]
