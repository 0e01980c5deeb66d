"""slsml: elastic, serverless training of Keras models on AWS Lambda.

Reading order follows the data flow: ``config`` and ``messages`` (what a run is and what the
functions say to each other), ``keys`` and ``wiring`` (where things live and who triggers whom),
``plan``/``updates``/``optimizers`` (the model as a flat vector, split among reducers), ``data``,
then ``steps`` (the five pipeline functions in chain order), ``runs`` (starting and following a
run) and ``local`` (the embedded cloud the same functions run on).
"""

__version__ = "0.1.0"
