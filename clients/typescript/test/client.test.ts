/**
 * The client against the real service: a whole turn, the profile's versions, typed problem
 * errors, and the retry rules (one Idempotency-Key across 503s, Retry-After waited, nothing
 * unsafe repeated, aborts and timeouts).
 */

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import {
  CONFLICT_RETRY_TYPE,
  Conflict,
  ContextMemoryClient,
  NotFound,
  PreconditionFailed,
  RetryableConflict,
  ServiceUnavailable,
  TransportError,
  Unauthorized,
  Unprocessable,
  parseRetryAfter,
  retryDelayMs,
  DEFAULT_RETRY_POLICY,
  type TurnRequest,
} from "context-memory-client";

import { BASE_URL, CONFLICT_RETRY, NO_SERVICE, SPACE, failingFetch, freshUser } from "./support.js";

const FACT = "I work as a credit risk analyst at Helvetia Bank.";

function turn(question: string, answer = "Noted."): TurnRequest {
  return { space_id: SPACE, messages: [{ role: "user", content: question }], response: { content: answer } };
}

describe("retry arithmetic", () => {
  test("Retry-After is read as seconds or as an HTTP date", () => {
    assert.equal(parseRetryAfter("3"), 3);
    assert.equal(parseRetryAfter(null), null);
    assert.equal(parseRetryAfter("soon"), null);
    const now = Date.parse("Wed, 21 Oct 2026 07:28:00 GMT");
    assert.equal(parseRetryAfter("Wed, 21 Oct 2026 07:28:05 GMT", now), 5);
  });

  test("backoff has full jitter under a ceiling, and Retry-After is capped", () => {
    const policy = { ...DEFAULT_RETRY_POLICY, backoffBaseMs: 100, backoffMaxMs: 1000 };
    assert.equal(retryDelayMs(policy, 3, null, () => 0.999999) < 400, true);
    assert.equal(retryDelayMs(policy, 10, null, () => 1), 1000);
    assert.equal(retryDelayMs(policy, 1, null, () => 0), 0);
    assert.equal(retryDelayMs(policy, 1, 120, () => 0), DEFAULT_RETRY_POLICY.maxRetryAfterMs);
    assert.equal(retryDelayMs(policy, 1, 2, () => 1), 2000 * (1 + DEFAULT_RETRY_POLICY.jitter));
  });
});

describe("against the service", { skip: NO_SERVICE }, () => {
  test("a whole turn: context, turn-save, consolidation, the memory and its versions", async () => {
    const { client } = await freshUser();
    const question = [{ role: "user" as const, content: FACT }];
    const context = await client.loadContext("chat-1", {
      space_id: SPACE,
      messages: question,
      system_prompt: "You are a helpful assistant.",
    });
    assert.equal(context.memory.enabled, true, context.memory.reason);
    assert.equal(context.messages.at(-1)?.content, FACT);
    const saved = await client.saveTurn("chat-1", turn(FACT, "Nice to meet you!"));
    assert.equal(saved.saved_messages, 2);
    assert.equal(saved.consolidation.status, "queued");
    const job = await client.waitForJob(saved.consolidation.job_id ?? "", { timeoutMs: 30_000 });
    assert.equal(job.status, "succeeded");
    const profile = await client.getMemory();
    assert.match(profile.content, /Helvetia Bank/);

    const next = await client.loadContext("chat-2", { space_id: SPACE, messages: question });
    assert.equal(next.memory.injected, true);
    assert.match(next.system_prompt ?? "", /What I know about you[\s\S]*Helvetia Bank/);

    const edited = await client.putMemory(profile.content.replace("Helvetia", "Zurich"), {
      version: profile.version,
    });
    assert.equal(edited.version, profile.version + 1);
    await assert.rejects(client.putMemory("stale", { version: profile.version }), PreconditionFailed);
    const versions = [];
    for await (const version of client.listVersions({ pageSize: 1 })) versions.push(version.version);
    assert.deepEqual(versions, [edited.version, profile.version]);
    const diff = await client.diffVersions(edited.version);
    assert.match(diff.diff, /-.*Helvetia[\s\S]*\+.*Zurich/);
    const restored = await client.restoreVersion(profile.version, { ifMatch: edited.version });
    assert.match(restored.content, /Helvetia/);
    assert.equal((await client.getMemoryIfChanged(restored.version)), null);
    const exported = await client.exportMemory();
    assert.equal(exported.profile?.version, restored.version);
    assert.equal((await client.getSettings()).context_memory, true);
    assert.equal((await client.getEnablement(SPACE)).enabled, true);
  });

  test("messages are listed a page at a time, and a deleted chat is gone", async () => {
    const { client } = await freshUser();
    for (let n = 0; n < 3; n++) await client.saveTurn("chat-p", turn(`question ${n}`, `answer ${n}`));
    const contents = [];
    for await (const message of client.listMessages("chat-p", { pageSize: 2 })) {
      contents.push(message.content);
    }
    assert.deepEqual(contents.sort(), ["answer 0", "answer 1", "answer 2", "question 0", "question 1", "question 2"]);
    await client.deleteChat("chat-p");
    await assert.rejects(client.listMessagesPage("chat-p"), NotFound);
  });

  test("an explicit consolidation waits for its job; the job is readable", async () => {
    const { client } = await freshUser();
    const job = await client.consolidateNow(
      { space_id: SPACE, user: "I live in Lisbon.", assistant: "Lisbon it is." },
      { wait: true, waitSeconds: 20 },
    );
    assert.equal(job.status, "succeeded");
    assert.equal((await client.getJob(job.id)).id, job.id);
    assert.match((await client.getMemory()).content, /Lisbon/);
  });

  test("error answers are typed errors carrying status, type, title, detail and request id", async () => {
    const { client, token } = await freshUser();
    const missing = await client.getMemory().then(
      () => assert.fail("a user without memory has none"),
      (error: unknown) => error,
    );
    assert.ok(missing instanceof NotFound);
    assert.equal(missing.status, 404);
    assert.equal(missing.type, "urn:context-memory:problem:not-found");
    assert.equal(missing.retryable, false);
    assert.ok(missing.title && missing.detail);
    assert.ok(missing.requestId);

    const invalid = await client
      .saveTurn("chat-e", { ...turn("hi"), messages: [] })
      .catch((error: unknown) => error);
    assert.ok(invalid instanceof Unprocessable);
    assert.ok(invalid.errors.some((field) => field.field.includes("messages")), JSON.stringify(invalid.errors));

    const stranger = new ContextMemoryClient({ baseUrl: BASE_URL, token: token + "x" });
    await assert.rejects(stranger.getMe(), Unauthorized);
  });

  test("a turn-save retried across two 503s keeps one key and stores one turn", async () => {
    const front = failingFetch("/turns", 2, "1");
    const { client } = await freshUser({ fetch: front.fetch, retries: { jitter: 0 } });
    const started = performance.now();
    const saved = await client.saveTurn("chat-r", turn(FACT));
    const elapsed = performance.now() - started;
    assert.equal(saved.saved_messages, 2);
    assert.equal(front.keys.length, 3);
    assert.ok(front.keys[0], "the first attempt carries an Idempotency-Key");
    assert.equal(new Set(front.keys).size, 1, "every attempt carries the same Idempotency-Key");
    assert.ok(elapsed >= 2000, `waited the Retry-After of each 503 (${elapsed} ms)`);
    const page = await client.listMessagesPage("chat-r");
    assert.equal(page.items.length, 2, "exactly one turn was stored");
  });

  test("a caller's key is kept and a 503 past the last attempt is thrown", async () => {
    const front = failingFetch("/turns", 5, "0");
    const { client } = await freshUser({ fetch: front.fetch, retries: { maxAttempts: 3 } });
    const error = await client
      .saveTurn("chat-x", turn(FACT), { idempotencyKey: "turn-42" })
      .catch((caught: unknown) => caught);
    assert.ok(error instanceof ServiceUnavailable);
    assert.equal(error.retryAfterSeconds, 0);
    assert.equal(error.retryable, true, "a 503 is retryable though its problem does not say");
    assert.equal(error.requestId, "front");
    assert.deepEqual(front.keys, ["turn-42", "turn-42", "turn-42"]);
    await assert.rejects(client.listMessagesPage("chat-x"), NotFound);
  });

  test("a turn-save retried across two conflict-retry 409s keeps one key and stores one turn", async () => {
    const front = failingFetch("/turns", 2, "1", CONFLICT_RETRY);
    const { client } = await freshUser({ fetch: front.fetch, retries: { jitter: 0 } });
    const started = performance.now();
    const saved = await client.saveTurn("chat-c", turn(FACT));
    const elapsed = performance.now() - started;
    assert.equal(saved.saved_messages, 2);
    assert.equal(front.keys.length, 3);
    assert.ok(front.keys[0], "the first attempt carries an Idempotency-Key");
    assert.equal(new Set(front.keys).size, 1, "every attempt carries the same Idempotency-Key");
    assert.ok(elapsed >= 2000, `waited the Retry-After of each 409 (${elapsed} ms)`);
    assert.equal((await client.listMessagesPage("chat-c")).items.length, 2, "one turn stored");
  });

  test("a conflict-retry past the last attempt is a RetryableConflict, a Conflict", async () => {
    const front = failingFetch("/turns", 5, "0", CONFLICT_RETRY);
    const { client } = await freshUser({ fetch: front.fetch, retries: { maxAttempts: 2 } });
    const error = await client
      .saveTurn("chat-k", turn(FACT), { idempotencyKey: "turn-7" })
      .catch((caught: unknown) => caught);
    assert.ok(error instanceof RetryableConflict);
    assert.ok(error instanceof Conflict);
    assert.equal(error.name, "RetryableConflict");
    assert.equal(error.type, CONFLICT_RETRY_TYPE);
    assert.equal(error.retryable, true);
    assert.equal(error.retryAfterSeconds, 0);
    assert.deepEqual(front.keys, ["turn-7", "turn-7"]);
  });

  test("a conflict only a change of state can mend is thrown at once, retryable false", async () => {
    const { token } = await freshUser();
    let calls = 0;
    const client = new ContextMemoryClient({
      baseUrl: BASE_URL,
      token,
      fetch: async (input, init) => {
        if (new URL(String(input)).pathname === "/v1/me/memory") calls++;
        return fetch(input, init);
      },
    });
    await client.setMemoryEnabled(false);
    const profile = "# User Memory\n\n## Identity\n- An analyst\n";
    const error = await client.putMemory(profile, { version: null }).catch((caught: unknown) => caught);
    assert.ok(error instanceof Conflict, String(error));
    assert.ok(!(error instanceof RetryableConflict));
    assert.equal(error.type, "urn:context-memory:problem:conflict");
    assert.equal(error.retryable, false);
    assert.equal(calls, 1, "a conflict that is not retryable is not repeated");
  });

  test("an explicit consolidation is not repeated after a conflict-retry", async () => {
    const front = failingFetch("/consolidations", 1, "0", CONFLICT_RETRY);
    const { client } = await freshUser({ fetch: front.fetch });
    await assert.rejects(
      client.consolidateNow({ space_id: SPACE, user: "hi", assistant: "hello" }),
      RetryableConflict,
    );
    assert.equal(front.keys.length, 1);
  });

  test("concurrent saves of one turn with one key all answer the same turn, saved once", async () => {
    const { client } = await freshUser();
    const saves = await Promise.all(
      Array.from({ length: 6 }, () => client.saveTurn("chat-same", turn(FACT), { idempotencyKey: "same-turn" })),
    );
    assert.equal(new Set(saves.map((saved) => saved.turn_id)).size, 1);
    assert.equal((await client.listMessagesPage("chat-same")).items.length, 2);
  });

  test("an explicit consolidation is not repeated after a 503", async () => {
    const front = failingFetch("/consolidations", 1, "0");
    const { client } = await freshUser({ fetch: front.fetch });
    await assert.rejects(
      client.consolidateNow({ space_id: SPACE, user: "hi", assistant: "hello" }),
      ServiceUnavailable,
    );
    assert.equal(front.keys.length, 1);
  });

  test("a network error is retried; the token is asked again before every attempt", async () => {
    const { token } = await freshUser();
    let asked = 0;
    let calls = 0;
    const client = new ContextMemoryClient({
      baseUrl: BASE_URL,
      getToken: () => {
        asked++;
        return token;
      },
      retries: { backoffBaseMs: 10 },
      fetch: async (input, init) => {
        if (++calls === 1) throw new TypeError("fetch failed");
        return fetch(input, init);
      },
    });
    assert.ok((await client.getMe()).user_id);
    assert.equal(calls, 2);
    assert.equal(asked, 2);
  });

  test("an attempt that times out is retried, then a TransportError", async () => {
    let calls = 0;
    const client = new ContextMemoryClient({
      baseUrl: BASE_URL,
      token: "t",
      timeoutMs: 50,
      retries: { maxAttempts: 2, backoffBaseMs: 10 },
      fetch: (_input, init) =>
        new Promise((_resolve, reject) => {
          calls++;
          init?.signal?.addEventListener("abort", () => reject(init.signal?.reason));
        }),
    });
    await assert.rejects(client.getMe(), TransportError);
    assert.equal(calls, 2);
  });

  test("a caller's abort ends the call and its retries at once", async () => {
    const front = failingFetch("/turns", 5, "30");
    const { client } = await freshUser({ fetch: front.fetch });
    const controller = new AbortController();
    const saving = client.saveTurn("chat-a", turn(FACT), { signal: controller.signal });
    setTimeout(() => controller.abort(), 100);
    await assert.rejects(saving, { name: "AbortError" });
    assert.equal(front.keys.length, 1, "aborted while waiting the Retry-After: no second attempt");
  });

  test("a service that does not answer is a TransportError after the retries", async () => {
    const client = new ContextMemoryClient({
      baseUrl: "http://127.0.0.1:9",
      token: "t",
      timeoutMs: 1000,
      retries: { maxAttempts: 2, backoffBaseMs: 10 },
    });
    await assert.rejects(client.getMe(), TransportError);
  });
});
