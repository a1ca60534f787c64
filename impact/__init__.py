"""Impact."""
