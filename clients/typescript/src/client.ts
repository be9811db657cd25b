/**
 * `ContextMemoryClient`: every route of the service's API as a method, over the
 * global `fetch` (or one given), with the Python client's retry rules: a request is repeated
 * only when repeating it is safe (after a 429, a 503, a 409 `conflict-retry`, or no answer), a
 * turn-save keeps one `Idempotency-Key` across its attempts, and `Retry-After` is honoured.
 */

import { Conflict, ProblemError, problemFromResponse, TransportError } from "./errors.js";
import {
  DEFAULT_RETRY_POLICY,
  parseRetryAfter,
  retryDelayMs,
  sleep,
  type RetryPolicy,
} from "./retry.js";
import type { paths } from "./generated/openapi.js";
import type {
  AuditEventOut,
  CompanyImportOut,
  CompanyIn,
  CompanyOut,
  ConsolidationRequest,
  ContextRequest,
  ContextResponse,
  DecisionOut,
  ErasureOut,
  FeatureFlag,
  FeatureFlagOut,
  FeatureFlagsOut,
  FolderOut,
  Health,
  JobStatus,
  JobSummary,
  JobView,
  Me,
  MemoryExportOut,
  MemoryImportIn,
  MemoryOut,
  MemoryPolicyIn,
  MemoryPolicyOut,
  ModelBudgetIn,
  ModelBudgetOut,
  OffboardingOut,
  Page,
  PolicyActionOut,
  RateLimitsIn,
  RateLimitsOut,
  Readiness,
  SpacePatch,
  SpaceSettingsOut,
  StoredMessageOut,
  TurnRequest,
  TurnSaved,
  UsageReportOut,
  UserSettingsOut,
  UserSettingsUpdateOut,
  VersionDiffOut,
  UserErasureOut,
  VersionOut,
  VersionSummaryOut,
} from "./types.js";

export interface ClientOptions {
  /** Where the service answers, e.g. `http://127.0.0.1:8000`. */
  baseUrl: string;
  /** The end user's bearer token. */
  token?: string;
  /** Asked before every attempt instead of `token`, so a token may be refreshed. */
  getToken?: () => string | Promise<string>;
  /** A `fetch` of your own (a test's, a proxy's); default the global one. */
  fetch?: typeof fetch;
  /** Changes to the default retry policy; `{ maxAttempts: 1 }` never retries. */
  retries?: Partial<RetryPolicy>;
  /** Bounds every attempt (default 10 s); a timed-out attempt is retried like a network error. */
  timeoutMs?: number;
}

/** What every method takes last. */
export interface CallOptions {
  /** Aborts the call, its retries and the waits between them (never retried). */
  signal?: AbortSignal;
  /** This call's attempt timeout instead of the client's. */
  timeoutMs?: number;
}

export interface PageOptions extends CallOptions {
  limit?: number;
  cursor?: string;
}

export interface IterOptions extends CallOptions {
  pageSize?: number;
}

type Query = Record<string, string | number | boolean | undefined>;

type Method = "get" | "put" | "post" | "delete" | "patch";

/**
 * Every operation of the contract as `"METHOD /path/{name}"` (`"GET /v1/jobs/{job_id}"`): a
 * route that `openapi.yaml` does not have fails the type-check.
 */
export type Route = {
  [P in keyof paths]: {
    [M in Method]-?: [Exclude<paths[P][M], undefined>] extends [never]
      ? never
      : `${Uppercase<M>} ${P}`;
  }[Method];
}[keyof paths];

/** A route with its path parameters filled in. */
interface Routed {
  method: "GET" | "POST" | "PUT" | "PATCH" | "DELETE";
  path: string;
}

/** One request, built once: every retry sends exactly these headers and this body. */
interface Call extends Routed {
  query?: Query;
  body?: unknown;
  /** A body that is not JSON, sent as it is (`headers` names its `Content-Type`). */
  raw?: string;
  headers?: Record<string, string>;
  /** Safe to send again: a read, a conditional or set-style write, or carries an idempotency key. */
  retryable: boolean;
}

/** A successful answer, read. */
interface Answer {
  status: number;
  body: string;
}

const TERMINAL_JOB_STATUSES: ReadonlySet<JobView["status"]> = new Set(["succeeded", "dead"]);

export class ContextMemoryClient {
  readonly baseUrl: string;
  readonly retry: RetryPolicy;
  readonly timeoutMs: number;
  readonly #token: ClientOptions["getToken"];
  readonly #fetch: typeof fetch;

  constructor(options: ClientOptions) {
    if (options.token !== undefined && options.getToken !== undefined) {
      throw new TypeError("give `token` or `getToken`, not both");
    }
    this.baseUrl = options.baseUrl.replace(/\/+$/, "");
    this.retry = Object.freeze({ ...DEFAULT_RETRY_POLICY, ...options.retries });
    this.timeoutMs = options.timeoutMs ?? 10_000;
    const token = options.token;
    this.#token = options.getToken ?? (token === undefined ? undefined : () => token);
    this.#fetch = options.fetch ?? ((input, init) => globalThis.fetch(input, init));
  }

  // --- the orchestrator's two calls -------------------------------------------------------------

  /** Before the model call: the final messages and the composed system prompt. */
  loadContext(
    chatId: string,
    request: ContextRequest,
    options?: CallOptions,
  ): Promise<ContextResponse> {
    // A read: it stores nothing the caller could see twice, so it is retried like a GET.
    const to = route("POST /v1/chats/{chat_id}/context", { chat_id: chatId });
    return this.#json({ ...to, body: request, retryable: true }, options);
  }

  /**
   * After the answer: save the exchange. Without `idempotencyKey` one is generated; every retry
   * sends the same key, so the turn is saved once however often it was sent.
   */
  saveTurn(
    chatId: string,
    request: TurnRequest,
    options?: CallOptions & { idempotencyKey?: string },
  ): Promise<TurnSaved> {
    const key = options?.idempotencyKey ?? crypto.randomUUID();
    return this.#json(
      {
        ...route("POST /v1/chats/{chat_id}/turns", { chat_id: chatId }),
        body: request,
        headers: { "Idempotency-Key": key },
        retryable: true,
      },
      options,
    );
  }

  /** One page of the chat's stored messages. */
  listMessagesPage(chatId: string, options?: PageOptions): Promise<Page<StoredMessageOut>> {
    return this.#page(route("GET /v1/chats/{chat_id}/messages", { chat_id: chatId }), {}, options);
  }

  /** Every stored message of the chat, fetched a page at a time. */
  listMessages(chatId: string, options?: IterOptions): AsyncGenerator<StoredMessageOut> {
    return this.#paginate((cursor) => this.listMessagesPage(chatId, pageOf(options, cursor)));
  }

  /** Delete the chat and its messages. */
  deleteChat(chatId: string, options?: CallOptions): Promise<void> {
    const to = route("DELETE /v1/chats/{chat_id}", { chat_id: chatId });
    return this.#none({ ...to, retryable: true }, options);
  }

  // --- the user ---------------------------------------------------------------------------------

  getMe(options?: CallOptions): Promise<Me> {
    return this.#json({ ...route("GET /v1/me"), retryable: true }, options);
  }

  /** Delete everything the service holds about the caller. */
  eraseMe(options?: CallOptions): Promise<ErasureOut> {
    return this.#json({ ...route("DELETE /v1/me"), retryable: true }, options);
  }

  /** The current profile (`NotFound` when there is none). */
  getMemory(options?: CallOptions): Promise<MemoryOut> {
    return this.#json({ ...route("GET /v1/me/memory"), retryable: true }, options);
  }

  /** The current profile, or null when it still is `version`. */
  async getMemoryIfChanged(version: number, options?: CallOptions): Promise<MemoryOut | null> {
    const headers = { "If-None-Match": etag(version) };
    const call: Call = { ...route("GET /v1/me/memory"), headers, retryable: true };
    const answer = await this.#send(call, options);
    return answer.status === 304 ? null : (JSON.parse(answer.body) as MemoryOut);
  }

  /**
   * Write the whole profile, compare-and-set: `version` is the one it replaces (`If-Match`),
   * or null to create the first (`If-None-Match: *`). `PreconditionFailed` when it moved on.
   */
  putMemory(
    content: string,
    options: CallOptions & { version: number | null },
  ): Promise<MemoryOut> {
    // Conditional, so a repeat can never overwrite a newer version: at worst it gets a 412.
    return this.#json(
      {
        ...route("PUT /v1/me/memory"),
        body: { content },
        headers: conditionHeaders(options.version),
        retryable: true,
      },
      options,
    );
  }

  /** Clear the profile and its history (at `ifMatch` when given). */
  deleteMemory(options?: CallOptions & { ifMatch?: number }): Promise<void> {
    const headers = options?.ifMatch === undefined ? {} : { "If-Match": etag(options.ifMatch) };
    return this.#none({ ...route("DELETE /v1/me/memory"), headers, retryable: true }, options);
  }

  listVersionsPage(options?: PageOptions): Promise<Page<VersionSummaryOut>> {
    return this.#page(route("GET /v1/me/memory/versions"), {}, options);
  }

  /** Every retained version, newest first, fetched a page at a time. */
  listVersions(options?: IterOptions): AsyncGenerator<VersionSummaryOut> {
    return this.#paginate((cursor) => this.listVersionsPage(pageOf(options, cursor)));
  }

  getVersion(n: number, options?: CallOptions): Promise<VersionOut> {
    const to = route("GET /v1/me/memory/versions/{n}", { n });
    return this.#json({ ...to, retryable: true }, options);
  }

  /** Unified diff of version `n` against `against` (default: the version before it). */
  diffVersions(
    n: number,
    options?: CallOptions & { against?: number },
  ): Promise<VersionDiffOut> {
    const to = route("GET /v1/me/memory/versions/{n}/diff", { n });
    const query = { against: options?.against };
    return this.#json({ ...to, query, retryable: true }, options);
  }

  /**
   * Make version `n` the current profile (a new version). Retried only with `ifMatch`: without
   * it a repeat would add a second version.
   */
  restoreVersion(n: number, options?: CallOptions & { ifMatch?: number }): Promise<MemoryOut> {
    const ifMatch = options?.ifMatch;
    return this.#json(
      {
        ...route("POST /v1/me/memory/versions/{n}/restore", { n }),
        headers: ifMatch === undefined ? {} : { "If-Match": etag(ifMatch) },
        retryable: ifMatch !== undefined,
      },
      options,
    );
  }

  listPolicyActionsPage(options?: PageOptions): Promise<Page<PolicyActionOut>> {
    return this.#page(route("GET /v1/me/memory/policy-actions"), {}, options);
  }

  /** What the company's memory policy kept out of the memory, newest first (never values). */
  listPolicyActions(options?: IterOptions): AsyncGenerator<PolicyActionOut> {
    return this.#paginate((cursor) => this.listPolicyActionsPage(pageOf(options, cursor)));
  }

  exportMemory(options?: CallOptions): Promise<MemoryExportOut> {
    return this.#json({ ...route("GET /v1/me/memory/export"), retryable: true }, options);
  }

  /**
   * Make an export's profile the current one. `version` as in `putMemory` makes it conditional
   * (and so retried); without it the import is sent once.
   */
  importMemory(
    document: MemoryImportIn,
    options?: CallOptions & { version?: number | null },
  ): Promise<MemoryOut> {
    const version = options?.version;
    return this.#json(
      {
        ...route("POST /v1/me/memory/import"),
        body: document,
        headers: version === undefined ? {} : conditionHeaders(version),
        retryable: version !== undefined,
      },
      options,
    );
  }

  getSettings(options?: CallOptions): Promise<UserSettingsOut> {
    return this.#json({ ...route("GET /v1/me/settings"), retryable: true }, options);
  }

  /** Switch context memory on or off for the caller; off deletes the memory for good. */
  setMemoryEnabled(enabled: boolean, options?: CallOptions): Promise<UserSettingsUpdateOut> {
    // Sets a value: repeating it changes nothing more.
    const body = { context_memory: enabled };
    return this.#json({ ...route("PATCH /v1/me/settings"), body, retryable: true }, options);
  }

  /** Whether context memory is effectively on for the caller in `spaceId`, and why. */
  getEnablement(spaceId: string, options?: CallOptions): Promise<DecisionOut> {
    const query = { space_id: spaceId };
    const to = route("GET /v1/me/memory/enablement");
    return this.#json({ ...to, query, retryable: true }, options);
  }

  /**
   * Consolidate one exchange now; with `wait` the answer is the finished job (or the pending one
   * when the server's `waitSeconds` ran out). Never retried: it has no idempotency key, and a
   * repeat would queue the exchange twice.
   */
  consolidateNow(
    request: ConsolidationRequest,
    options?: CallOptions & { wait?: boolean; waitSeconds?: number },
  ): Promise<JobView> {
    const query = { wait: options?.wait || undefined, timeout: options?.waitSeconds };
    const to = route("POST /v1/me/memory/consolidations");
    return this.#json({ ...to, query, body: request, retryable: false }, options);
  }

  getJob(jobId: string, options?: CallOptions): Promise<JobView> {
    const to = route("GET /v1/jobs/{job_id}", { job_id: jobId });
    return this.#json({ ...to, retryable: true }, options);
  }

  /** Poll the job until it succeeded or is dead; rejects after `timeoutMs` (default 30 s). */
  async waitForJob(
    jobId: string,
    options?: { timeoutMs?: number; pollIntervalMs?: number; signal?: AbortSignal },
  ): Promise<JobView> {
    const deadline = Date.now() + (options?.timeoutMs ?? 30_000);
    const signal = options?.signal;
    for (;;) {
      const job = await this.getJob(jobId, signal ? { signal } : {});
      if (TERMINAL_JOB_STATUSES.has(job.status)) return job;
      if (Date.now() >= deadline) {
        throw new Error(`job ${jobId} still ${job.status} after ${options?.timeoutMs ?? 30_000} ms`);
      }
      await sleep(options?.pollIntervalMs ?? 200, signal);
    }
  }

  // --- space admins -----------------------------------------------------------------------------

  getSpace(spaceId: string, options?: CallOptions): Promise<SpaceSettingsOut> {
    const to = route("GET /v1/spaces/{space_id}", { space_id: spaceId });
    return this.#json({ ...to, retryable: true }, options);
  }

  updateSpace(spaceId: string, patch: SpacePatch, options?: CallOptions): Promise<SpaceSettingsOut> {
    const to = route("PATCH /v1/spaces/{space_id}", { space_id: spaceId });
    return this.#json({ ...to, body: patch, retryable: true }, options);
  }

  /** The company's user-memory folder and who may read and write it. */
  getUserMemoryFolder(companyId: string, options?: CallOptions): Promise<FolderOut> {
    const to = route("GET /v1/companies/{company_id}/folders/user-memory", { company_id: companyId });
    return this.#json({ ...to, retryable: true }, options);
  }

  // --- operators (a company's settings, audit trail, jobs, usage and data) ----------------------

  listFeatureFlags(companyId: string, options?: CallOptions): Promise<FeatureFlagsOut> {
    const to = route("GET /v1/companies/{company_id}/feature-flags", { company_id: companyId });
    return this.#json({ ...to, retryable: true }, options);
  }

  setFeatureFlag(
    companyId: string,
    flag: FeatureFlag,
    enabled: boolean,
    options?: CallOptions,
  ): Promise<FeatureFlagOut> {
    const to = route("PUT /v1/companies/{company_id}/feature-flags/{flag}", {
      company_id: companyId,
      flag,
    });
    return this.#json({ ...to, body: { enabled }, retryable: true }, options);
  }

  getMemoryPolicy(companyId: string, options?: CallOptions): Promise<MemoryPolicyOut> {
    const to = route("GET /v1/companies/{company_id}/memory-policy", { company_id: companyId });
    return this.#json({ ...to, retryable: true }, options);
  }

  /** Replace the company's memory policy (every member; audited). */
  setMemoryPolicy(
    companyId: string,
    policy: MemoryPolicyIn,
    options?: CallOptions,
  ): Promise<MemoryPolicyOut> {
    // The whole policy: repeating it changes nothing more.
    const to = route("PUT /v1/companies/{company_id}/memory-policy", { company_id: companyId });
    return this.#json({ ...to, body: policy, retryable: true }, options);
  }

  listAuditEventsPage(companyId: string, options?: PageOptions): Promise<Page<AuditEventOut>> {
    const to = route("GET /v1/companies/{company_id}/audit-events", { company_id: companyId });
    return this.#page(to, {}, options);
  }

  /** The company's audit trail, newest first, fetched a page at a time. */
  listAuditEvents(companyId: string, options?: IterOptions): AsyncGenerator<AuditEventOut> {
    return this.#paginate((cursor) => this.listAuditEventsPage(companyId, pageOf(options, cursor)));
  }

  listCompanyJobsPage(
    companyId: string,
    options?: PageOptions & { status?: JobStatus },
  ): Promise<Page<JobSummary>> {
    const to = route("GET /v1/companies/{company_id}/jobs", { company_id: companyId });
    return this.#page(to, { status: options?.status }, options);
  }

  /** The company's jobs (of one `status` when given), fetched a page at a time. */
  listCompanyJobs(
    companyId: string,
    options?: IterOptions & { status?: JobStatus },
  ): AsyncGenerator<JobSummary> {
    const status = options?.status;
    return this.#paginate((cursor) =>
      this.listCompanyJobsPage(companyId, { ...pageOf(options, cursor), ...(status ? { status } : {}) }),
    );
  }

  /** Send a dead job back to the queue. Never retried: a repeat of a retry is no retry. */
  retryJob(companyId: string, jobId: string, options?: CallOptions): Promise<JobSummary> {
    const to = route("POST /v1/companies/{company_id}/jobs/{job_id}/retry", {
      company_id: companyId,
      job_id: jobId,
    });
    return this.#json({ ...to, retryable: false }, options);
  }

  /** The company's rate limits by class, and which of them its overrides set. */
  getRateLimits(companyId: string, options?: CallOptions): Promise<RateLimitsOut> {
    const to = route("GET /v1/companies/{company_id}/rate-limits", { company_id: companyId });
    return this.#json({ ...to, retryable: true }, options);
  }

  /** Replace the company's overrides (a class left out: the defaults; audited). */
  setRateLimits(
    companyId: string,
    limits: RateLimitsIn,
    options?: CallOptions,
  ): Promise<RateLimitsOut> {
    // The whole set of overrides: repeating it changes nothing more.
    const to = route("PUT /v1/companies/{company_id}/rate-limits", { company_id: companyId });
    return this.#json({ ...to, body: limits, retryable: true }, options);
  }

  /** The company's usage for every UTC day from `from` to `to` (`YYYY-MM-DD`, both included). */
  getUsage(
    companyId: string,
    range: { from: string; to: string },
    options?: CallOptions,
  ): Promise<UsageReportOut> {
    const to = route("GET /v1/companies/{company_id}/usage", { company_id: companyId });
    return this.#json({ ...to, query: { from: range.from, to: range.to }, retryable: true }, options);
  }

  /** The company's monthly model budget and what it spent this month. */
  getModelBudget(companyId: string, options?: CallOptions): Promise<ModelBudgetOut> {
    const to = route("GET /v1/companies/{company_id}/model-budget", { company_id: companyId });
    return this.#json({ ...to, retryable: true }, options);
  }

  /** Replace the company's monthly model budget (audited). */
  setModelBudget(
    companyId: string,
    budget: ModelBudgetIn,
    options?: CallOptions,
  ): Promise<ModelBudgetOut> {
    const to = route("PUT /v1/companies/{company_id}/model-budget", { company_id: companyId });
    return this.#json({ ...to, body: budget, retryable: true }, options);
  }

  /** The whole company as the NDJSON stream `importCompany` reads (docs/portability.md). */
  async exportCompany(companyId: string, options?: CallOptions): Promise<string> {
    const to = route("GET /v1/companies/{company_id}/export", { company_id: companyId });
    const headers = { Accept: NDJSON };
    return (await this.#send({ ...to, headers, retryable: true }, options)).body;
  }

  /**
   * Load an export of this very company into a deployment that holds nothing of it. Safe to
   * repeat: the same stream sent again answers the first import's outcome (`replayed`).
   */
  importCompany(companyId: string, stream: string, options?: CallOptions): Promise<CompanyImportOut> {
    const to = route("POST /v1/companies/{company_id}/import", { company_id: companyId });
    const headers = { "Content-Type": NDJSON };
    return this.#json({ ...to, raw: stream, headers, retryable: true }, options);
  }

  // --- the control plane: companies, offboarding, erasure requests ------------------------------

  /** One page of the companies (platform operators), in the order of their ids. */
  listCompaniesPage(options?: PageOptions): Promise<Page<CompanyOut>> {
    return this.#page(route("GET /v1/companies"), {}, options);
  }

  /** Every company, fetched a page at a time. */
  listCompanies(options?: IterOptions): AsyncGenerator<CompanyOut> {
    return this.#paginate((cursor) => this.listCompaniesPage(pageOf(options, cursor)));
  }

  /** Register a company (platform operators); registered already: its record. */
  createCompany(company: CompanyIn, options?: CallOptions): Promise<CompanyOut> {
    return this.#json({ ...route("POST /v1/companies"), body: company, retryable: true }, options);
  }

  getCompany(companyId: string, options?: CallOptions): Promise<CompanyOut> {
    const to = route("GET /v1/companies/{company_id}", { company_id: companyId });
    return this.#json({ ...to, retryable: true }, options);
  }

  /** Erase everything the company holds (platform operators); sent again, the same receipt. */
  offboardCompany(companyId: string, options?: CallOptions): Promise<OffboardingOut> {
    const to = route("DELETE /v1/companies/{company_id}", { company_id: companyId });
    return this.#json({ ...to, retryable: true }, options);
  }

  getOffboarding(companyId: string, options?: CallOptions): Promise<OffboardingOut> {
    const to = route("GET /v1/companies/{company_id}/offboarding", { company_id: companyId });
    return this.#json({ ...to, retryable: true }, options);
  }

  /** Erase a user of the company on request (its operators); the receipt with the counts. */
  eraseCompanyUser(companyId: string, userId: string, options?: CallOptions): Promise<UserErasureOut> {
    const to = route("DELETE /v1/companies/{company_id}/users/{user_id}", {
      company_id: companyId,
      user_id: userId,
    });
    return this.#json({ ...to, retryable: true }, options);
  }

  listCompanySpacesPage(companyId: string, options?: PageOptions): Promise<Page<SpaceSettingsOut>> {
    const to = route("GET /v1/companies/{company_id}/spaces", { company_id: companyId });
    return this.#page(to, {}, options);
  }

  listCompanySpaces(companyId: string, options?: IterOptions): AsyncGenerator<SpaceSettingsOut> {
    return this.#paginate((cursor) => this.listCompanySpacesPage(companyId, pageOf(options, cursor)));
  }

  getCompanySpace(companyId: string, spaceId: string, options?: CallOptions): Promise<SpaceSettingsOut> {
    const to = route("GET /v1/companies/{company_id}/spaces/{space_id}/settings", {
      company_id: companyId,
      space_id: spaceId,
    });
    return this.#json({ ...to, retryable: true }, options);
  }

  setCompanySpace(
    companyId: string,
    spaceId: string,
    patch: SpacePatch,
    options?: CallOptions,
  ): Promise<SpaceSettingsOut> {
    const to = route("PUT /v1/companies/{company_id}/spaces/{space_id}/settings", {
      company_id: companyId,
      space_id: spaceId,
    });
    return this.#json({ ...to, body: patch, retryable: true }, options);
  }

  // --- operations -------------------------------------------------------------------------------

  health(options?: CallOptions): Promise<Health> {
    return this.#json({ ...route("GET /healthz"), retryable: true }, options);
  }

  ready(options?: CallOptions): Promise<Readiness> {
    return this.#json({ ...route("GET /readyz"), retryable: true }, options);
  }

  // --- sending ----------------------------------------------------------------------------------

  async #json<T>(call: Call, options: CallOptions | undefined): Promise<T> {
    return JSON.parse((await this.#send(call, options)).body) as T;
  }

  async #none(call: Call, options: CallOptions | undefined): Promise<void> {
    await this.#send(call, options);
  }

  #page<T>(to: Routed, query: Query, options: PageOptions | undefined): Promise<Page<T>> {
    const paged = { ...query, limit: options?.limit, cursor: options?.cursor };
    return this.#json({ ...to, query: paged, retryable: true }, options);
  }

  async *#paginate<T>(page: (cursor: string | undefined) => Promise<Page<T>>): AsyncGenerator<T> {
    let cursor: string | undefined;
    do {
      const current = await page(cursor);
      yield* current.items;
      cursor = current.next_cursor ?? undefined;
    } while (cursor !== undefined);
  }

  /**
   * Send `call`, retrying it by the policy when it is safe to repeat; resolves with a successful
   * answer's status and body (read within the attempt, under its timeout), throws the typed
   * error of an error answer.
   */
  async #send(call: Call, options: CallOptions | undefined): Promise<Answer> {
    const signal = options?.signal;
    const timeoutMs = options?.timeoutMs ?? this.timeoutMs;
    const url = this.#url(call);
    for (let attempt = 1; ; attempt++) {
      signal?.throwIfAborted();
      const mayRetry = call.retryable && attempt < this.retry.maxAttempts;
      const timeout = new AbortController();
      const timer = setTimeout(
        () => timeout.abort(new DOMException(`no answer within ${timeoutMs} ms`, "TimeoutError")),
        timeoutMs,
      );
      const attemptSignal = signal ? AbortSignal.any([signal, timeout.signal]) : timeout.signal;
      let delayMs: number;
      try {
        const response = await this.#fetch(url, await this.#init(call, attemptSignal));
        if (response.ok || response.status === 304) {
          return { status: response.status, body: await response.text() };
        }
        const retryAfter = parseRetryAfter(response.headers.get("retry-after"));
        if (mayRetry && this.retry.retryStatuses.includes(response.status)) {
          await response.body?.cancel();
        } else {
          // a 409 is retried when its problem says so (a `conflict-retry`: nothing was written)
          const problem = await problemFromResponse(response, retryAfter);
          if (!mayRetry || !(problem instanceof Conflict && problem.retryable)) throw problem;
        }
        delayMs = retryDelayMs(this.retry, attempt, retryAfter);
      } catch (error) {
        if (error instanceof ProblemError) throw error;
        if (signal?.aborted) throw signal.reason;
        if (!mayRetry) {
          const message = `${call.method} ${call.path}: ${describe(error)}`;
          throw new TransportError(message, { cause: error });
        }
        delayMs = retryDelayMs(this.retry, attempt, null);
      } finally {
        clearTimeout(timer);
      }
      await sleep(delayMs, signal);
    }
  }

  async #init(call: Call, signal: AbortSignal): Promise<RequestInit> {
    const headers: Record<string, string> = { Accept: "application/json", ...call.headers };
    if (call.body !== undefined) headers["Content-Type"] = "application/json";
    const token = await this.#token?.();
    if (token) headers["Authorization"] = `Bearer ${token}`;
    const body = call.raw ?? (call.body === undefined ? null : JSON.stringify(call.body));
    return { method: call.method, headers, body, signal };
  }

  #url(call: Call): string {
    const query = new URLSearchParams();
    for (const [name, value] of Object.entries(call.query ?? {})) {
      if (value !== undefined) query.set(name, String(value));
    }
    const search = query.toString() ? `?${query}` : "";
    return `${this.baseUrl}${call.path}${search}`;
  }
}

/** The entity tag of a profile version (`"3"`). */
export function etag(version: number): string {
  return `"${version}"`;
}

function conditionHeaders(version: number | null): Record<string, string> {
  return version === null ? { "If-None-Match": "*" } : { "If-Match": etag(version) };
}

/**
 * The method and path of `to` with each `{name}` replaced by `params[name]`, percent-encoded.
 * Every method of the client builds its request with it, so the route each one calls is
 * written once, in the contract's own words (tests/client/test_operation_coverage.py reads
 * them).
 */
function route(to: Route, params: Record<string, string | number> = {}): Routed {
  const space = to.indexOf(" ");
  const path = to.slice(space + 1).replace(/\{([^}]+)\}/g, (_, name: string) => {
    const value = params[name];
    if (value === undefined) throw new TypeError(`${to}: no value for {${name}}`);
    return seg(value);
  });
  return { method: to.slice(0, space) as Routed["method"], path };
}

const NDJSON = "application/x-ndjson";

function seg(value: string | number): string {
  return encodeURIComponent(String(value));
}

function pageOf(options: IterOptions | undefined, cursor: string | undefined): PageOptions {
  const page: PageOptions = {};
  if (options?.pageSize !== undefined) page.limit = options.pageSize;
  if (cursor !== undefined) page.cursor = cursor;
  if (options?.signal !== undefined) page.signal = options.signal;
  if (options?.timeoutMs !== undefined) page.timeoutMs = options.timeoutMs;
  return page;
}

function describe(error: unknown): string {
  if (!(error instanceof Error)) return String(error);
  const cause = error.cause instanceof Error ? ` (${error.cause.message})` : "";
  return `${error.name}: ${error.message}${cause}`;
}
