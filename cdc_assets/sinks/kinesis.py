"""The Kinesis sink's client: PutRecords with the table and primary key as partition key, every record's result
read, the refused ones (ProvisionedThroughputExceeded, InternalFailure) sent again with backoff.

Kinesis keeps records of one partition key in order on its shard, but PutRecords does not keep the order of a
request's records when some of them fail and are sent again. So a request never holds two records of one
partition key (`plan_requests`), and the next request goes out only after every record of this one was
accepted: a retried record can never land after a later change of its key. A TRUNCATE or a schema change
concerns every key of its table, so it is put on every open shard (ExplicitHashKey of each), in a request of
its own between the changes before and after it: on each shard it sits exactly where it happened.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, NoRegionError

from cdc_assets.core.errors import CdcUserError
from cdc_assets.sinks.broker import SinkConnectionLost
from cdc_assets.sinks.events import SinkEvent
from cdc_assets.sinks.settings import SinkSettings

MAX_RECORDS = 500  # per PutRecords request (Kinesis's limits)
MAX_REQUEST_BYTES = 5 * 1024 * 1024
MAX_RECORD_BYTES = 1024 * 1024  # data and partition key of one record
THROTTLE_RETRY_SECONDS = 60.0  # how long refused records are retried before the run gives up
RETRYABLE_RECORD_ERRORS = frozenset({"ProvisionedThroughputExceededException", "InternalFailure"})
THROTTLING_ERRORS = frozenset(
    {"ProvisionedThroughputExceededException", "LimitExceededException", "ThrottlingException", "KMSThrottlingException"}
)
CREDENTIAL_ERRORS = frozenset(
    {
        "UnrecognizedClientException",
        "InvalidSignatureException",
        "InvalidClientTokenId",
        "SignatureDoesNotMatch",
        "ExpiredTokenException",
        "AccessDeniedException",
        "AccessDenied",
        "IncompleteSignature",
        "MissingAuthenticationToken",
    }
)


@dataclass(frozen=True)
class Record:
    """One PutRecords entry: the event it carries, and the shard's hash key when put on a chosen shard."""

    event: SinkEvent
    explicit_hash_key: str | None = None

    @property
    def size(self) -> int:
        return len(self.event.body) + len(self.event.partition_key.encode("utf-8"))

    def entry(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"Data": self.event.body, "PartitionKey": self.event.partition_key}
        if self.explicit_hash_key is not None:
            entry["ExplicitHashKey"] = self.explicit_hash_key
        return entry


def plan_requests(events: list[SinkEvent], shard_hash_keys: list[str]) -> list[list[Record]]:
    """The PutRecords requests of a window, sent one after the other: at most one record per partition key in
    a request (so retrying a request's refused records cannot reorder a key), within Kinesis's limits, and every
    broadcast event (TRUNCATE, schema change) alone in a request of its own, once per open shard."""
    requests: list[list[Record]] = []
    current: list[Record] = []
    keys: set[str] = set()
    size = 0
    for event in events:
        record = Record(event)
        if record.size > MAX_RECORD_BYTES:
            raise CdcUserError(
                f"The change {event.id} of {event.table} makes a {record.size:,}-byte message, above Kinesis's "
                "1 MiB per record: leave the table out of the Kinesis sink (CDC_KINESIS_EXCLUDE_TABLES)."
            )
        if event.broadcast:
            if current:
                requests.append(current)
            requests.append([Record(event, key) for key in shard_hash_keys] or [record])
            current, keys, size = [], set(), 0
            continue
        if event.partition_key in keys or len(current) >= MAX_RECORDS or size + record.size > MAX_REQUEST_BYTES:
            requests.append(current)
            current, keys, size = [], set(), 0
        current.append(record)
        keys.add(event.partition_key)
        size += record.size
    if current:
        requests.append(current)
    return requests


def refused(records: list[Record], results: list[dict[str, Any]]) -> tuple[list[Record], set[str]]:
    """The records PutRecords did not accept, in their order, and the error codes it gave."""
    failed = [r for r, result in zip(records, results, strict=True) if result.get("ErrorCode")]
    return failed, {result["ErrorCode"] for result in results if result.get("ErrorCode")}


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


class KinesisPublisher:
    def __init__(self, sink: SinkSettings, sleep: Callable[[float], None] = time.sleep) -> None:
        assert sink.stream is not None
        self.sink = sink
        self.stream = sink.stream
        self.destination = sink.destination
        self.sleep = sleep
        self.client: Any = None
        self.shard_hash_keys: list[str] = []
        self.refused_records = 0  # records Kinesis refused and that were sent again

    def _user_error(self, exc: BaseException) -> CdcUserError | None:
        """The sentence for what a user must fix, or None for a broker that is away."""
        if isinstance(exc, NoRegionError):
            return CdcUserError("No AWS region is set for the Kinesis sink: set AWS_REGION (e.g. us-east-1).")
        if isinstance(exc, NoCredentialsError):
            return CdcUserError(
                "No AWS credentials were found for the Kinesis sink: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
                "(or another standard AWS credential source)."
            )
        if isinstance(exc, ClientError):
            code = _code(exc)
            if code == "ResourceNotFoundException":
                return CdcUserError(
                    f"The Kinesis stream '{self.stream}' does not exist: create it, or set CDC_KINESIS_STREAM to one that "
                    "does (and AWS_REGION / AWS_ENDPOINT_URL_KINESIS to where it is)."
                )
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in CREDENTIAL_ERRORS or status in (401, 403):
                return CdcUserError(
                    f"Kinesis refused the AWS credentials for stream '{self.stream}' ({code or status}): fix AWS_ACCESS_KEY_ID / "
                    "AWS_SECRET_ACCESS_KEY, or grant them kinesis:PutRecords, ListShards and DescribeStreamSummary."
                )
        return None

    def open(self) -> None:
        try:
            self.client = boto3.client(
                "kinesis",
                region_name=self.sink.region,
                config=Config(retries={"mode": "standard", "max_attempts": 3}, connect_timeout=5, read_timeout=30),
            )
            self._load_shards()
        except (ClientError, BotoCoreError) as exc:
            user = self._user_error(exc)
            if user is not None:
                raise user from None
            endpoint = getattr(self.client, "meta", None) and self.client.meta.endpoint_url
            raise CdcUserError(
                f"Cannot reach Kinesis at {endpoint or 'its endpoint'} ({exc}): check the network, AWS_REGION and "
                "AWS_ENDPOINT_URL_KINESIS."
            ) from None

    def _load_shards(self) -> None:
        summary = self.client.describe_stream_summary(StreamName=self.stream)["StreamDescriptionSummary"]
        if summary.get("StreamStatus") not in ("ACTIVE", "UPDATING"):
            raise CdcUserError(
                f"The Kinesis stream '{self.stream}' is {summary.get('StreamStatus')}, not ACTIVE: wait until it is, "
                "then publish again."
            )
        shards: list[dict[str, Any]] = []
        kwargs: dict[str, Any] = {"StreamName": self.stream}
        while True:
            page = self.client.list_shards(**kwargs)
            shards.extend(page.get("Shards", []))
            if not page.get("NextToken"):
                break
            kwargs = {"NextToken": page["NextToken"]}
        open_shards = [s for s in shards if "EndingSequenceNumber" not in s.get("SequenceNumberRange", {})]
        self.shard_hash_keys = [s["HashKeyRange"]["StartingHashKey"] for s in open_shards]

    def reconnect(self) -> None:
        try:
            self._load_shards()
        except (ClientError, BotoCoreError) as exc:
            user = self._user_error(exc)
            if user is not None:
                raise user from None
            raise SinkConnectionLost(str(exc)) from None

    def send(self, events: list[SinkEvent]) -> None:
        for request in plan_requests(events, self.shard_hash_keys):
            self._put(request)

    def _put(self, records: list[Record]) -> None:
        """One request, until every record was accepted: refused records (throttling, internal failures) are
        sent again, alone, after an exponential backoff with jitter."""
        deadline = time.monotonic() + THROTTLE_RETRY_SECONDS
        delay = 0.05
        pending = records
        while pending:
            try:
                answer = self.client.put_records(StreamName=self.stream, Records=[r.entry() for r in pending])
                failed, codes = refused(pending, answer["Records"])
            except ClientError as exc:
                user = self._user_error(exc)
                if user is not None:
                    raise user from None
                if _code(exc) not in THROTTLING_ERRORS:
                    raise SinkConnectionLost(f"PutRecords failed ({_code(exc) or exc})") from None
                failed, codes = pending, {_code(exc)}
            except BotoCoreError as exc:
                raise SinkConnectionLost(f"PutRecords failed ({exc})") from None
            if not failed:
                return
            unexpected = codes - RETRYABLE_RECORD_ERRORS - THROTTLING_ERRORS
            if unexpected:
                raise CdcUserError(
                    f"Kinesis stream '{self.stream}' refused records with {', '.join(sorted(unexpected))}: see the stream's "
                    "settings (encryption keys, permissions); nothing after them was published."
                )
            if time.monotonic() > deadline:
                raise CdcUserError(
                    f"Kinesis stream '{self.stream}' kept refusing records ({', '.join(sorted(codes))}) for "
                    f"{THROTTLE_RETRY_SECONDS:.0f} s: add shards or lower the load; the sink's checkpoint stays before "
                    "them and the next publish sends them again."
                )
            self.refused_records += len(failed)
            self.sleep(random.uniform(delay / 2, delay))
            delay = min(delay * 2, 2.0)
            pending = failed

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
