"""Run state in DynamoDB and Step Functions: records, the run table, relaxed barriers, once-per-message
processing, the run state machine."""
