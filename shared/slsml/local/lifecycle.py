"""The bucket's lifecycle rules and the table's TTL, applied to the local cloud as S3 and DynamoDB apply them
(moto stores both and applies neither): ``expire(services, now)`` deletes what they would have deleted by
``now``. The local service runs it periodically with the clock's time; a test runs it with a time of its
choosing (days ahead), so that what a run stopped for a week finds is what it would find on AWS."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import ClientError

from slsml.aws.clients import error_code
from slsml.aws.storage import ObjectStore
from slsml.pipeline.services import Services
from slsml.state.records import PARTITION_KEY, SORT_KEY

PERIOD_S = 3600.0  # how often the local service applies them: S3 and DynamoDB act within a day or two


@dataclass
class Expired:
    """What one pass deleted."""

    objects: list[str] = field(default_factory=list)
    uploads: int = 0  # incomplete multipart uploads aborted
    items: int = 0  # table items past their TTL


def expires_at(created: dt.datetime, days: int) -> float:
    """When S3 expires an object created at ``created`` under a rule of ``days``: ``days`` after its creation,
    rounded up to the next midnight UTC."""
    due = created.astimezone(dt.UTC) + dt.timedelta(days=days)
    midnight = due.replace(hour=0, minute=0, second=0, microsecond=0)
    return (midnight if midnight == due else midnight + dt.timedelta(days=1)).timestamp()


def _filter(rule: dict[str, Any]) -> tuple[str, dict[str, str]]:
    """A rule's prefix and tags, of each form S3 takes (``Filter`` with ``Prefix``, ``Tag`` or ``And``; the older
    top-level ``Prefix``)."""
    found = rule.get("Filter", {})
    both = found.get("And", found)
    tags = both.get("Tags", [found["Tag"]] if "Tag" in found else [])
    return both.get("Prefix", rule.get("Prefix", "")), {tag["Key"]: tag["Value"] for tag in tags}


def _rules(services: Services) -> list[dict[str, Any]]:
    store = services.store
    try:
        rules = store.s3.get_bucket_lifecycle_configuration(Bucket=store.bucket)["Rules"]
    except ClientError as error:
        if error_code(error) == "NoSuchLifecycleConfiguration":
            return []
        raise
    return [rule for rule in rules if rule.get("Status") == "Enabled"]


def _expire_objects(services: Services, rule: dict[str, Any], now: float, deleter: ObjectStore) -> list[str]:
    store, days = services.store, rule["Expiration"]["Days"]
    prefix, tags = _filter(rule)
    pages = store.s3.get_paginator("list_objects_v2").paginate(Bucket=store.bucket, Prefix=prefix)
    due = [
        obj["Key"] for page in pages for obj in page.get("Contents", []) if expires_at(obj["LastModified"], days) <= now
    ]
    if tags:  # the tags are read of the objects past their time only
        due = [key for key in due if tags.items() <= _tags(services, key).items()]
    deleter.delete(due)
    return due


def _tags(services: Services, key: str) -> dict[str, str]:
    store = services.store
    tag_set = store.s3.get_object_tagging(Bucket=store.bucket, Key=key)["TagSet"]
    return {tag["Key"]: tag["Value"] for tag in tag_set}


def _abort_uploads(services: Services, rule: dict[str, Any], now: float) -> int:
    store, days = services.store, rule["AbortIncompleteMultipartUpload"]["DaysAfterInitiation"]
    uploads = store.s3.list_multipart_uploads(Bucket=store.bucket, Prefix=_filter(rule)[0]).get("Uploads", [])
    due = [upload for upload in uploads if expires_at(upload["Initiated"], days) <= now]
    for upload in due:
        store.s3.abort_multipart_upload(Bucket=store.bucket, Key=upload["Key"], UploadId=upload["UploadId"])
    return len(due)


def _expire_items(services: Services, now: float) -> int:
    """Delete the items whose TTL attribute (a number of epoch seconds) lies before ``now``."""
    table = services.table.table
    described = table.meta.client.describe_time_to_live(TableName=table.name)["TimeToLiveDescription"]
    if described.get("TimeToLiveStatus") != "ENABLED":
        return 0
    attribute, expired = described["AttributeName"], 0
    kwargs: dict[str, Any] = {
        "FilterExpression": "#ttl < :now",
        "ExpressionAttributeNames": {"#ttl": attribute},
        "ExpressionAttributeValues": {":now": int(now)},
        "ProjectionExpression": f"{PARTITION_KEY.name}, {SORT_KEY.name}",
    }
    with table.batch_writer() as batch:
        while True:
            page = table.scan(**kwargs)
            for item in page["Items"]:
                batch.delete_item(Key=item)
                expired += 1
            if "LastEvaluatedKey" not in page:
                return expired
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def expire(services: Services, now: float, deleter: ObjectStore | None = None) -> Expired:
    """Apply the bucket's lifecycle rules and the table's TTL at the time ``now`` (epoch seconds), objects deleted
    through ``deleter`` (default: ``services.store``; the local cloud's lifecycle identity, whom its bucket's policy
    lets delete under runs/)."""
    expired = Expired()
    for rule in _rules(services):
        if "Expiration" in rule:
            expired.objects += _expire_objects(services, rule, now, deleter or services.store)
        if "AbortIncompleteMultipartUpload" in rule:
            expired.uploads += _abort_uploads(services, rule, now)
    expired.items = _expire_items(services, now)
    return expired
