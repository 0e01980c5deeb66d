"""A worker's round below the step that wires it to messages and storage: its micro-batches' size
(``sizing``), their stream of reads ahead of compute (``stream``), their gradients added up (``accumulate``), its
slice of an evaluation (``evaluation``), and a model's pipeline stages in figures (``stages``)."""
