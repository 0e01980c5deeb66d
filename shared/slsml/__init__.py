"""slsml: elastic, serverless training of Keras models on AWS Lambda.

One package per concern, importing downward only: ``spec`` (what a run is and what the functions say to
each other), ``training`` and ``rules`` (numerics without AWS), ``accounting``, ``aws``, ``data`` and ``state``,
``cost`` (the cost model), ``pipeline`` and its ``steps`` (the functions), ``search`` (a hyperparameter search's
engine and records), ``client`` and ``local`` (a user's machine), ``bench`` and ``cli``. CONTRIBUTING.md gives the
reading order.
"""

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """``slsml.fit`` (``slsml.client.fit``) and ``slsml.tune`` (``slsml.client.tune``), imported on first use: the
    functions import this package without them."""
    if name == "fit":
        from slsml.client.fit import fit

        return fit
    if name == "tune":
        from slsml.client.tune import tune

        return tune
    raise AttributeError(f"module 'slsml' has no attribute {name!r}")
