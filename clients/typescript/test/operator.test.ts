/**
 * The operator's calls against the real service, each group written and read back: feature
 * flags, the memory policy, the audit trail, jobs, the user-memory folder, rate limits, usage,
 * the model budget, and a company exported and imported. Hostile input comes back as the typed
 * problem error naming what was wrong; a call that is not safe to repeat is sent once.
 */

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { describe, test } from "node:test";

import {
  Conflict,
  ContextMemoryClient,
  FLAG_CONTEXT_MEMORY,
  Forbidden,
  NotFound,
  Unprocessable,
  type MemoryPolicyIn,
} from "context-memory-client";

import { BASE_URL, NO_SERVICE, SPACE, freshUser, mintToken } from "./support.js";

function freshCompany(): string {
  return `ts-op-${randomUUID().slice(0, 8)}`;
}

function operator(options: { fetch?: typeof fetch } = {}): ContextMemoryClient {
  const token = mintToken("olga", "platform", ["operator"]);
  return new ContextMemoryClient({ baseUrl: BASE_URL, token, ...options });
}

/** Today and `days` before it, as `YYYY-MM-DD` UTC days. */
function lastDays(days: number): { from: string; to: string } {
  const to = new Date();
  const from = new Date(to.getTime() - days * 86_400_000);
  return { from: from.toISOString().slice(0, 10), to: to.toISOString().slice(0, 10) };
}

const POLICY: MemoryPolicyIn = {
  secrets: "drop",
  payment_cards: "drop",
  bank_accounts: "drop",
  national_ids: "drop",
  email_addresses: "redact",
  phone_numbers: "drop",
  instructions: "drop",
  recent_topics_days: 30,
  inactive_memory_days: 0,
};

describe("the operator's calls against the service", { skip: NO_SERVICE }, () => {
  test("feature flags, the memory policy and the audit trail they leave", async () => {
    const company = freshCompany();
    const client = operator();
    await client.createCompany({ company_id: company }); // operator writes need it
    await client.setFeatureFlag(company, FLAG_CONTEXT_MEMORY, true);
    const flags = await client.listFeatureFlags(company);
    assert.equal(flags.company_id, company);
    assert.deepEqual(
      flags.flags.filter((flag) => flag.flag === FLAG_CONTEXT_MEMORY).map((flag) => flag.enabled),
      [true],
    );

    assert.equal((await client.getMemoryPolicy(company)).default, true);
    const policy = await client.setMemoryPolicy(company, { ...POLICY, recent_topics_days: 14 });
    assert.equal(policy.recent_topics_days, 14);
    assert.equal(policy.default, false);
    assert.deepEqual(await client.getMemoryPolicy(company), policy);

    const events = [];
    for await (const event of client.listAuditEvents(company, { pageSize: 1 })) events.push(event);
    assert.ok(events.length >= 2, JSON.stringify(events));
    assert.ok(events.every((event) => event.actor_id === "olga"));
    const page = await client.listAuditEventsPage(company, { limit: 1 });
    assert.equal(page.items.length, 1);
    assert.notEqual(page.next_cursor, null);
  });

  test("a policy the service refuses is Unprocessable naming the field, and nothing changes", async () => {
    const company = freshCompany();
    const client = operator();
    await client.createCompany({ company_id: company }); // operator writes need it
    await assert.rejects(
      client.setMemoryPolicy(company, { ...POLICY, recent_topics_days: -3 }),
      (error: unknown) =>
        error instanceof Unprocessable &&
        error.errors.some((field) => field.field.endsWith("recent_topics_days")),
    );
    assert.equal((await client.getMemoryPolicy(company)).default, true);
  });

  test("the company's jobs, one status at a time, and a retry of a job that is not there", async () => {
    const { company, client: user } = await freshUser();
    const saved = await user.saveTurn("chat-op", {
      space_id: SPACE,
      messages: [{ role: "user", content: "I work as a pilot at Swiss." }],
      response: { content: "Noted." },
    });
    await user.waitForJob(saved.consolidation.job_id ?? "", { timeoutMs: 30_000 });
    const requests: string[] = [];
    const counting: typeof fetch = (input, init) => {
      requests.push(`${init?.method} ${new URL(String(input)).pathname}`);
      return globalThis.fetch(input, init);
    };
    const client = operator({ fetch: counting });
    const jobs = [];
    for await (const job of client.listCompanyJobs(company, { pageSize: 1 })) jobs.push(job);
    assert.ok(jobs.some((job) => job.id === saved.consolidation.job_id), JSON.stringify(jobs));
    const succeeded = await client.listCompanyJobsPage(company, { status: "succeeded" });
    assert.ok(succeeded.items.every((job) => job.status === "succeeded"));
    const dead = await client.listCompanyJobsPage(company, { status: "dead" });
    assert.deepEqual(dead.items, []);

    requests.length = 0;
    await assert.rejects(client.retryJob(company, randomUUID()), NotFound);
    assert.equal(requests.length, 1, "a job retry is sent once");
    await assert.rejects(client.retryJob(company, "not-a-uuid"), (error: unknown) =>
      error instanceof NotFound || error instanceof Unprocessable,
    );
  });

  test("the user-memory folder: none in a fresh company, there once a memory is written", async () => {
    const adminOf = (company: string) =>
      new ContextMemoryClient({ baseUrl: BASE_URL, token: mintToken("sam", company, ["space_admin"]) });
    await assert.rejects(adminOf(freshCompany()).getUserMemoryFolder(freshCompany()), NotFound);
    const { company, client: user } = await freshUser();
    await user.consolidateNow(
      { space_id: SPACE, user: "I live in Lisbon.", assistant: "Lisbon it is." },
      { wait: true },
    );
    const folder = await adminOf(company).getUserMemoryFolder(company);
    assert.equal(typeof folder.path, "string");
    assert.equal(typeof folder.inherit_access, "boolean");
    assert.ok(folder.entries.length >= 1, JSON.stringify(folder));
  });

  test("rate limits are replaced, read back, and refused out of range", async () => {
    const company = freshCompany();
    const client = operator();
    await client.createCompany({ company_id: company }); // operator writes need it
    const before = await client.getRateLimits(company);
    assert.equal(before.default, true);
    const saved = await client.setRateLimits(company, {
      turns: { user: { quota: 240, window_seconds: 60 }, company: "unlimited" },
    });
    assert.equal(saved.default, false);
    assert.deepEqual(saved.turns.user, { limit: { quota: 240, window_seconds: 60 }, overridden: true });
    assert.deepEqual(saved.turns.company, { limit: null, overridden: true });
    assert.deepEqual(saved.context, before.context);
    assert.deepEqual(await client.getRateLimits(company), saved);

    await assert.rejects(
      client.setRateLimits(company, { turns: { user: { quota: 0, window_seconds: 60 } } }),
      (error: unknown) =>
        error instanceof Unprocessable && error.errors.some((field) => field.field.endsWith("quota")),
    );
    assert.deepEqual(await client.getRateLimits(company), saved);
  });

  test("the usage report has every day of its range, and refuses a range backwards", async () => {
    const company = freshCompany();
    const client = operator();
    await client.createCompany({ company_id: company }); // operator writes need it
    const range = lastDays(2);
    const report = await client.getUsage(company, range);
    assert.equal(report.company_id, company);
    assert.equal(report.days.length, 3);
    assert.equal(report.days[0]?.day, range.from);
    assert.equal(report.totals.turns_saved, 0);
    await assert.rejects(client.getUsage(company, { from: range.to, to: range.from }), Unprocessable);
    await assert.rejects(client.getUsage(company, { from: "2026-13-01", to: range.to }), Unprocessable);
  });

  test("the model budget is replaced and read back; a user may not", async () => {
    const company = freshCompany();
    const client = operator();
    await client.createCompany({ company_id: company }); // operator writes need it
    assert.equal((await client.getModelBudget(company)).monthly_tokens, null);
    const saved = await client.setModelBudget(company, { monthly_tokens: 5_000_000, when_spent: "offline" });
    assert.equal(saved.monthly_tokens, 5_000_000);
    assert.equal(saved.when_spent, "offline");
    assert.equal(saved.used_share, 0);
    assert.deepEqual(await client.getModelBudget(company), saved);
    await assert.rejects(
      client.setModelBudget(company, { monthly_tokens: -1, when_spent: "defer" }),
      Unprocessable,
    );
    const user = new ContextMemoryClient({ baseUrl: BASE_URL, token: mintToken("alice", company) });
    await assert.rejects(user.getModelBudget(company), Forbidden);
  });

  test("a company exported, imported under another id, imported again (replayed), then refused", async () => {
    const source = freshCompany();
    const target = freshCompany();
    const client = operator();
    await client.createCompany({ company_id: source }); // operator writes need it
    await client.setFeatureFlag(source, FLAG_CONTEXT_MEMORY, true);
    const lines = (await client.exportCompany(source))
      .split("\n")
      .filter((line) => line)
      .map((line) => JSON.parse(line) as { type: string; [member: string]: unknown });
    assert.equal(lines[0]?.type, "header");
    assert.equal(lines[0]?.["company_id"], source);
    assert.equal(lines.at(-1)?.type, "end");
    const flags = lines.filter((line) => line.type === "feature_flag");
    assert.equal(flags.length, 1);

    const stream = [
      { ...lines[0], company_id: target },
      ...flags,
      { type: "end", counts: { feature_flag: 1 } },
    ]
      .map((line) => `${JSON.stringify(line)}\n`)
      .join("");
    const first = await client.importCompany(target, stream);
    assert.equal(first.company_id, target);
    assert.equal(first.replayed, false);
    assert.equal(first.records["feature_flag"], 1);
    const again = await client.importCompany(target, stream);
    assert.deepEqual(again, { ...first, replayed: true });

    await assert.rejects(
      client.importCompany(target, stream.replace('"enabled":true', '"enabled":false')),
      (error: unknown) => error instanceof Conflict && !error.retryable,
    );
    await assert.rejects(
      client.importCompany(freshCompany(), "not json\n"),
      (error: unknown) =>
        error instanceof Unprocessable && error.errors.map((field) => field.field).join() === "body.lines.1",
    );
  });
});
