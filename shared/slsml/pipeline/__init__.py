"""The pipeline functions and what they share: the handler envelope, publishing, deadlines, metrics, the
services a function finds from its environment, and the steps themselves."""
