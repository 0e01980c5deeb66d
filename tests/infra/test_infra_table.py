"""The run table in the template is the one slsml.state.records defines, which the local runtime creates too."""

from __future__ import annotations

from slsml.state import records

from .conftest import Synthesized


def test_the_table_is_the_one_records_defines(synthesized: Synthesized) -> None:
    props = synthesized.resources[synthesized.logical_id(synthesized.stack.storage.table)]["Properties"]
    defined = records.create_table_arguments("any")
    assert props["KeySchema"] == defined["KeySchema"]
    assert sorted(props["AttributeDefinitions"], key=str) == sorted(defined["AttributeDefinitions"], key=str)
    assert props["GlobalSecondaryIndexes"] == defined["GlobalSecondaryIndexes"]
    assert props["BillingMode"] == defined["BillingMode"]
    assert props["TimeToLiveSpecification"] == {"AttributeName": records.TTL_ATTRIBUTE, "Enabled": True}
    # the runs index: sparse, on the attribute only a run's META item carries
    assert [i["IndexName"] for i in props["GlobalSecondaryIndexes"]] == [records.RUNS_INDEX.name]
