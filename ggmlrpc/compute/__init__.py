"""Graph execution per device: an executor compiles a validated graph into a plan."""
