"""The suite's one conftest: it registers the testbed plugin (fixtures: servers, trees)."""

pytest_plugins = ["testbed.plugin"]
