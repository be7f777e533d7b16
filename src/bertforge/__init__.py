"""bertforge."""
