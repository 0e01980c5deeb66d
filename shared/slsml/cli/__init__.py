"""The ``slsml`` command: its commands, what it shows, and a run's report."""
