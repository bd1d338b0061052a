"""What the demo and the tests run: the shipped demo workflows and the fake remotes the demo's
workflows call."""
