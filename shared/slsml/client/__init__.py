"""What a user's machine does with runs: start, follow and sum them up, find a deployed stack, the demo."""
