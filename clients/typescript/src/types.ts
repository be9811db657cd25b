/**
 * The service's schemas under their own names, all taken from the types generated from
 * `openapi.yaml` (src/generated/openapi.ts): a renamed or retyped field there fails the
 * type-check of everything that uses it.
 */

import type { components, operations } from "./generated/openapi.js";

type Schemas = components["schemas"];

export type Role = Schemas["Role"];
export type HistoryMode = Schemas["HistoryMode"];
export type MessageIn = Schemas["MessageIn"];
export type MessageOut = Schemas["MessageOut"];
export type ResponseIn = Schemas["ResponseIn"];
export type ContextRequest = Schemas["ContextRequest"];
export type ContextResponse = Schemas["ContextResponse"];
/** What the context call says about the memory it injected (or why it did not). */
export type ContextMemory = Schemas["app__turns__schemas__MemoryOut"];
export type TurnRequest = Schemas["TurnRequest"];
export type TurnSaved = Schemas["TurnSaved"];
export type StoredMessageOut = Schemas["StoredMessageOut"];
export type Me = Schemas["Me"];
export type ErasureOut = Schemas["ErasureOut"];
/** The user's profile; `version` is its entity tag for `If-Match`. */
export type MemoryOut = Schemas["app__profiles__schemas__MemoryOut"];
export type VersionSummaryOut = Schemas["VersionSummaryOut"];
export type VersionOut = Schemas["VersionOut"];
export type VersionDiffOut = Schemas["VersionDiffOut"];
export type PolicyActionOut = Schemas["PolicyActionOut"];
export type MemoryExportOut = Schemas["MemoryExportOut"];
export type MemoryImportIn = Schemas["MemoryImportIn"];
export type UserSettingsOut = Schemas["UserSettingsOut"];
export type UserSettingsUpdateOut = Schemas["UserSettingsUpdateOut"];
export type DecisionOut = Schemas["DecisionOut"];
export type ConsolidationRequest = Schemas["ConsolidationRequest"];
export type JobView = Schemas["JobView"];
export type SpacePatch = Schemas["SpacePatch"];
export type SpaceSettingsOut = Schemas["SpaceSettingsOut"];
export type FeatureFlagOut = Schemas["FeatureFlagOut"];
export type FeatureFlagsOut = Schemas["FeatureFlagsOut"];
export type FolderOut = Schemas["FolderOut"];
export type MemoryPolicyIn = Schemas["MemoryPolicyIn"];
export type MemoryPolicyOut = Schemas["MemoryPolicyOut"];
/** A company audit event (`listAuditEvents`). */
export type AuditEventOut = Schemas["app__enablement__schemas__AuditEventOut"];
export type JobStatus = Schemas["JobSummary"]["status"];
export type JobSummary = Schemas["JobSummary"];
export type RateLimitsIn = Schemas["RateLimitsIn"];
export type RateLimitsOut = Schemas["RateLimitsOut"];
export type UsageReportOut = Schemas["UsageReportOut"];
export type ModelBudgetIn = Schemas["ModelBudgetIn"];
export type ModelBudgetOut = Schemas["ModelBudgetOut"];
export type CompanyImportOut = Schemas["CompanyImportOut"];
export type Health = Schemas["Health"];
export type Readiness = Schemas["Readiness"];

// the control plane: companies, offboarding, erasure requests
export type CompanyIn = Schemas["CompanyIn"];
export type CompanyOut = Schemas["CompanyOut"];
export type UsageTotalsOut = Schemas["UsageTotalsOut"];
export type OffboardingOut = Schemas["OffboardingOut"];
export type UserErasureOut = Schemas["UserErasureOut"];

/** One page of a list; `next_cursor` is null on the last. */
export interface Page<T> {
  items: T[];
  next_cursor: string | null;
}

type SetFlag = operations["set_feature_flag_v1_companies__company_id__feature_flags__flag__put"];

/** A company feature flag's name (`setFeatureFlag`). */
export type FeatureFlag = SetFlag["parameters"]["path"]["flag"];

/** The company flag that gates context memory. */
export const FLAG_CONTEXT_MEMORY = "FEATURE_FLAG_ENABLE_CONTEXT_MEMORY_UN_22033" satisfies FeatureFlag;
