"""The five pipeline functions, in chain order: work_launcher → worker → reduce_launcher →
reducer → merger (→ the next model, which triggers work_launcher again). Each takes a parsed
message and the ``Services`` it may use, and is safe to run twice on the same message.
"""
