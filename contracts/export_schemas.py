"""Write the JSON Schema of every wire format to a directory: `python -m
contracts.export_schemas docs/schemas`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pydantic import BaseModel

from contracts.admin import (
    BuildRequest,
    DescriptorResponse,
    GcRequest,
    GcResponse,
    GenerationListResponse,
    GenerationView,
    GenerationViewResponse,
    PromoteReport,
    PromoteResponse,
    QualifyResponse,
    ReceiptListResponse,
    RollbackRequest,
    VerifyResponse,
)
from contracts.chonkydb import (
    AuthInfoResponse,
    BulkRecordsRequest,
    BulkRecordsResponse,
    ChonkyRetrieveRequest,
    ChonkyRetrieveResponse,
    ChonkyTopKRequest,
    ChonkyTopKResponse,
    DeleteRecordResponse,
    InstanceResponse,
    JobAccepted,
    JobStatusResponse,
    RecordListResponse,
    RecordOut,
)
from contracts.errors import ErrorResponse
from contracts.events import LogEntry
from contracts.generations import EvidenceCheck, GenerationDescriptor
from contracts.ingest_api import WriteRequest, WriteResponse
from contracts.koutendb import (
    AnyJson,
    Atlas,
    Envelope,
    FeedbackRequest,
    FeedbackResponse,
    KoutenPlanRequest,
    KoutenRetrieveRequest,
    PlanResponse,
    ProfileBody,
    ProfileResponse,
    ProfilesResponse,
    RecommendationsResponse,
    ValidateResponse,
)
from contracts.koutendb_io import (
    BackupRequest,
    BackupResponse,
    CompactResponse,
    DumpDocumentLine,
    DumpMetaLine,
    DumpRingLine,
    ImportLine,
    ImportResponse,
)
from contracts.ops import HealthResponse, ReadinessResponse, ScopesResponse
from contracts.phrases import VocabularySet
from contracts.profiles import ProfileSet
from contracts.qualification import QualifyRequest
from contracts.records import Record
from contracts.topk import (
    DocumentIdsResponse,
    RecordsByIdRequest,
    RecordsByIdResponse,
    RetrieveRequest,
    RetrieveResponse,
    TopKRequest,
    TopKResponse,
)

# Every wire format; `/openapi.json` takes its component schemas from the same models
# (`contracts.openapi`), so a route can only document a model listed here.
MODELS: dict[str, type[BaseModel]] = {
    "record": Record,
    "write_request": WriteRequest,
    "write_response": WriteResponse,
    "records_by_id_request": RecordsByIdRequest,
    "records_by_id_response": RecordsByIdResponse,
    "document_ids_response": DocumentIdsResponse,
    "health_response": HealthResponse,
    "readiness_response": ReadinessResponse,
    "scopes_response": ScopesResponse,
    "admin_build_request": BuildRequest,
    "admin_rollback_request": RollbackRequest,
    "admin_gc_request": GcRequest,
    "admin_generation_list_response": GenerationListResponse,
    "admin_generation_view_response": GenerationViewResponse,
    "admin_promote_response": PromoteResponse,
    "admin_gc_response": GcResponse,
    "admin_verify_response": VerifyResponse,
    "admin_qualify_request": QualifyRequest,
    "admin_qualify_response": QualifyResponse,
    "admin_receipt_list_response": ReceiptListResponse,
    "admin_descriptor_response": DescriptorResponse,
    "log_entry": LogEntry,
    "generation_descriptor": GenerationDescriptor,
    "evidence_check": EvidenceCheck,
    "admin_generation_view": GenerationView,
    "admin_promote_report": PromoteReport,
    "topk_request": TopKRequest,
    "topk_response": TopKResponse,
    "retrieve_request": RetrieveRequest,
    "retrieve_response": RetrieveResponse,
    "error_response": ErrorResponse,
    "fusion_profiles": ProfileSet,
    "vocabularies": VocabularySet,
    "chonkydb_topk_request": ChonkyTopKRequest,
    "chonkydb_topk_response": ChonkyTopKResponse,
    "chonkydb_retrieve_request": ChonkyRetrieveRequest,
    "chonkydb_retrieve_response": ChonkyRetrieveResponse,
    "chonkydb_instance_response": InstanceResponse,
    "chonkydb_auth_info_response": AuthInfoResponse,
    "chonkydb_record_list_response": RecordListResponse,
    "chonkydb_record": RecordOut,
    "chonkydb_delete_record_response": DeleteRecordResponse,
    "chonkydb_bulk_records_request": BulkRecordsRequest,
    "chonkydb_bulk_records_response": BulkRecordsResponse,
    "chonkydb_job_accepted": JobAccepted,
    "chonkydb_job_status_response": JobStatusResponse,
    "koutendb_import_line": ImportLine,
    "koutendb_import_response": ImportResponse,
    "koutendb_dump_meta_line": DumpMetaLine,
    "koutendb_dump_ring_line": DumpRingLine,
    "koutendb_dump_document_line": DumpDocumentLine,
    "admin_backup_request": BackupRequest,
    "admin_backup_response": BackupResponse,
    "admin_compact_response": CompactResponse,
    "koutendb_retrieve_request": KoutenRetrieveRequest,
    "koutendb_plan_request": KoutenPlanRequest,
    "koutendb_envelope": Envelope,
    "koutendb_plan_response": PlanResponse,
    "koutendb_validate_response": ValidateResponse,
    "koutendb_profile_body": ProfileBody,
    "koutendb_profile": ProfileResponse,
    "koutendb_profiles_response": ProfilesResponse,
    "koutendb_atlas": Atlas,
    "koutendb_feedback_request": FeedbackRequest,
    "koutendb_any_json": AnyJson,
    "koutendb_feedback_response": FeedbackResponse,
    "koutendb_recommendations_response": RecommendationsResponse,
}


def export(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, model in MODELS.items():
        path = directory / f"{name}.schema.json"
        schema = model.model_json_schema()
        path.write_text(json.dumps(schema, indent=2, ensure_ascii=False, sort_keys=True) + "\n")
        written.append(path)
    return written


if __name__ == "__main__":
    for written in export(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/schemas")):
        print(written)
