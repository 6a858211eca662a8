"""Repository-wide test configuration: the suite tests the plugin through pytester."""
