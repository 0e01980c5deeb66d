"""Ranged S3 GETs by pre-signed URL: a sample's bytes at a fraction of a GetObject call's CPU.

A GetObject through boto3 costs its process about 1.2 ms of CPU: its parameters validated and serialized, the
endpoint resolved from the rule set, the request signed, a dozen events emitted, the response's headers parsed.
In the exact data order a worker reads its samples one ranged GET each, and that was most of what its reads cost.
A pre-signed URL signs the host alone, not the ``Range`` header, so one URL signed for an object serves every
range of it: a GET is then an HTTP request on the client's own connection pool (its TLS and proxy settings), about
0.5 ms. A URL is signed for ``URL_EXPIRES_S`` and used for ``URL_REUSE_S`` (botocore refreshes credentials well
before they expire, so the credentials it was signed with outlast its use). Its answer carries the object's ETag,
which names the stored object the bytes came from: a reader that knows the one it expects checks it at no request
more.

Each GET is still one GetObject of the client: its ``before-parameter-build`` hooks see the call (fault
injection) and its ``before-send`` hooks may answer it (moto's in-process mock); it is retried under botocore's
standard mode (its conditions and backoff, the client's maximum attempts; no retry quota); each attempt and the
bytes read are counted (``usage.Sent``); an error response raises botocore's ``ClientError``, parsed as botocore
parses it.
"""

from __future__ import annotations

import time
from typing import Any

from botocore.awsrequest import AWSRequest
from botocore.exceptions import ClientError, ConnectionError, HTTPClientError
from botocore.hooks import first_non_none_response
from botocore.parsers import create_parser
from botocore.retries import standard

from slsml.accounting import usage

URL_EXPIRES_S = 900
URL_REUSE_S = 60
_OPERATION = "GetObject"


class RangedReads:
    """Ranged GETs of a bucket's objects through ``s3`` (a client that signs with SigV4, as ``slsml.aws.clients``
    makes them), by a pre-signed URL per object."""

    def __init__(self, s3: Any, bucket: str) -> None:
        self._s3, self._bucket = s3, bucket
        self._operation = s3.meta.service_model.operation_model(_OPERATION)
        self._parser = create_parser(s3.meta.service_model.resolved_protocol)
        self._events = s3.meta.events
        self._http = s3._endpoint.http_session  # the client's connection pool, as its own calls use it
        attempts = s3.meta.config.retries.get("total_max_attempts", standard.DEFAULT_MAX_ATTEMPTS)
        detector = standard.ThrottlingErrorDetector(standard.RetryEventAdapter())
        self._retry = standard.RetryPolicy(
            standard.StandardRetryConditions(max_attempts=attempts),
            standard.ExponentialBackoff(service_name="s3", throttling_detector=detector),
        )
        self._urls: dict[str, tuple[str, float]] = {}

    def get(self, key: str, first: int, last: int) -> tuple[bytes, str | None]:
        """Bytes ``first`` … ``last`` (inclusive) of the object ``key``, with the ETag of the object they were read
        from (the whole object's, which S3 answers a ranged GET with)."""
        byte_range = f"bytes={first}-{last}"
        params = {"Bucket": self._bucket, "Key": key, "Range": byte_range}
        self._events.emit(f"before-parameter-build.s3.{_OPERATION}", params=params, model=self._operation, context={})
        sent = usage.Sent(f"s3:{_OPERATION}")
        attempt = 0
        while True:
            attempt += 1
            request = AWSRequest(method="GET", url=self._url(key), headers={"Range": byte_range}).prepare()
            sent.attempt()
            response = parsed = failure = None
            try:
                response = self._send(request)
                body = response.content
            except (ConnectionError, HTTPClientError) as error:  # what botocore's standard mode may retry
                failure = error
            else:
                if response.status_code < 300:
                    sent.read(len(body))
                    return body, response.headers.get("ETag")
                parsed = self._parser.parse(
                    {"headers": response.headers, "status_code": response.status_code, "body": body},
                    self._operation.output_shape,
                )
            context = standard.RetryContext(
                attempt_number=attempt,
                operation_model=self._operation,
                parsed_response=parsed,
                http_response=response,
                caught_exception=failure,
                request_context={},
            )
            if not self._retry.should_retry(context):
                if failure is not None:
                    raise failure
                raise ClientError(parsed, _OPERATION)
            time.sleep(self._retry.compute_retry_delay(context))

    def _send(self, request: Any) -> Any:
        """The response of a ``before-send`` hook (a mock's), else of the client's connection pool."""
        answered = first_non_none_response(self._events.emit(f"before-send.s3.{_OPERATION}", request=request))
        return answered if answered is not None else self._http.send(request)

    def _url(self, key: str) -> str:
        """The object's pre-signed GET URL, signed anew past ``URL_REUSE_S``."""
        now = time.monotonic()
        url, signed = self._urls.get(key, ("", -URL_REUSE_S))
        if now - signed < URL_REUSE_S:
            return url
        url = self._s3.generate_presigned_url(
            "get_object", Params={"Bucket": self._bucket, "Key": key}, ExpiresIn=URL_EXPIRES_S
        )
        self._urls[key] = url, now
        return url
