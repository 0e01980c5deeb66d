"""Construct ids from pipeline names."""


def pascal(snake: str) -> str:
    """``work_launcher`` → ``WorkLauncher``."""
    return "".join(part.capitalize() for part in snake.split("_"))
