"""DeadLetters: every dead-letter queue → the run a dead-lettered message names FAILED, with its function's error."""

from slsml.pipeline.envelope import DeadLetterRecords, pipeline_handler
from slsml.pipeline.steps import dead_letters

lambda_handler = pipeline_handler(
    "dead_letters",
    dead_letters.DeadLetter,
    dead_letters.on_dead_letter,
    envelope=DeadLetterRecords,
    idempotent=False,
    batch_failures=True,
    charges=False,
)  # letters: failed messages, not a run's work
