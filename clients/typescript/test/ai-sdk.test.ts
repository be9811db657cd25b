/**
 * The Vercel AI SDK middleware with the SDK's own mock model against the real service: a whole
 * turn (context → model → turn-save → consolidation → the next turn sees the new memory) through
 * `generateText` and through `streamText`, and streams that error or are aborted save nothing.
 */

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { generateText, streamText, wrapLanguageModel } from "ai";
import { MockLanguageModelV4, convertArrayToReadableStream } from "ai/test";
import { NotFound, type ContextMemoryClient } from "context-memory-client";
import { contextMemoryMiddleware, type SavedTurnMetadata } from "context-memory-client/ai-sdk";

import { NO_SERVICE, SPACE, freshUser } from "./support.js";

type Prompt = MockLanguageModelV4["doGenerateCalls"][number]["prompt"];

const FACT = "I work as a data engineer at Globex.";
const SYSTEM = "You are a helpful assistant.";
const USAGE = {
  inputTokens: { total: 10, noCache: 10, cacheRead: undefined, cacheWrite: undefined },
  outputTokens: { total: 5, text: 5, reasoning: undefined },
};
const FINISH = { unified: "stop" as const, raw: "stop" };

function generating(answer: string): MockLanguageModelV4 {
  return new MockLanguageModelV4({
    modelId: "mock-model",
    doGenerate: async () => ({
      content: [{ type: "text", text: answer }],
      finishReason: FINISH,
      usage: USAGE,
      warnings: [],
    }),
  });
}

function streaming(parts: () => ReadableStream<never>): MockLanguageModelV4 {
  return new MockLanguageModelV4({ modelId: "mock-model", doStream: async () => ({ stream: parts() }) });
}

function answerParts(answer: string): unknown[] {
  const words = answer.split(/(?<= )/);
  return [
    { type: "stream-start", warnings: [] },
    { type: "text-start", id: "t" },
    ...words.map((delta) => ({ type: "text-delta", id: "t", delta })),
    { type: "text-end", id: "t" },
    { type: "finish", finishReason: FINISH, usage: USAGE },
  ];
}

function systemOf(prompt: Prompt | undefined): string {
  const first = prompt?.[0];
  return first?.role === "system" ? first.content : "";
}

async function storedContents(client: ContextMemoryClient, chatId: string): Promise<string[]> {
  const contents: string[] = [];
  try {
    for await (const message of client.listMessages(chatId)) contents.push(message.content);
  } catch (error) {
    if (!(error instanceof NotFound)) throw error;
  }
  return contents;
}

function savedTurn(metadata: Record<string, unknown> | undefined): SavedTurnMetadata {
  const turn = metadata?.["contextMemory"] as SavedTurnMetadata | undefined;
  assert.ok(turn, "the result carries the saved turn in providerMetadata.contextMemory");
  return turn;
}

describe("contextMemoryMiddleware", { skip: NO_SERVICE }, () => {
  test("generateText: memory in, turn saved, consolidated, and the next turn sees it", async () => {
    const { client } = await freshUser();
    const middleware = contextMemoryMiddleware({ client, chatId: "chat-g", spaceId: SPACE });
    const first = generating("Nice to meet you!");
    const result = await generateText({
      model: wrapLanguageModel({ model: first, middleware }),
      system: SYSTEM,
      prompt: FACT,
    });
    assert.equal(result.text, "Nice to meet you!");
    assert.equal(systemOf(first.doGenerateCalls[0]?.prompt), SYSTEM, "no memory yet");
    const turn = savedTurn(result.providerMetadata);
    assert.equal(turn.consolidation, "queued");
    assert.deepEqual((await storedContents(client, "chat-g")).sort(), [FACT, "Nice to meet you!"].sort());
    const job = await client.waitForJob(turn.jobId ?? "");
    assert.equal(job.outcome, "updated");

    const second = generating("At Globex.");
    const next = await generateText({
      model: wrapLanguageModel({ model: second, middleware }),
      system: SYSTEM,
      prompt: "Where do I work?",
    });
    const prompt = second.doGenerateCalls[0]?.prompt;
    assert.match(systemOf(prompt), /^You are a helpful assistant\.[\s\S]*What I know about you[\s\S]*Globex/);
    // auto mode, no history from the caller: the stored exchange is loaded before the question
    const texts = prompt?.slice(1).map((m) => (m.role === "system" ? m.content : m.content.map((p) => (p.type === "text" ? p.text : "")).join("")));
    assert.deepEqual(texts, [FACT, "Nice to meet you!", "Where do I work?"]);
    assert.equal(savedTurn(next.providerMetadata).memoryInjected, true);
  });

  test("streamText: saved once the stream has finished, then consolidated into the next turn", async () => {
    const { client } = await freshUser();
    const middleware = contextMemoryMiddleware({ client, chatId: "chat-s", spaceId: SPACE, mode: "record_all" });
    const answer = "Globex sounds like a fun place to build pipelines.";
    const first = streaming(() => convertArrayToReadableStream(answerParts(answer) as never[]));
    const result = streamText({
      model: wrapLanguageModel({ model: first, middleware }),
      system: SYSTEM,
      messages: [
        { role: "user", content: "Hello!" },
        { role: "assistant", content: "Hi, how can I help?" },
        { role: "user", content: FACT },
      ],
    });
    let streamed = "";
    for await (const delta of result.textStream) streamed += delta;
    assert.equal(streamed, answer);
    const turn = savedTurn(await result.providerMetadata);
    // record_all stores the caller's history too: every message of the turn, once
    assert.deepEqual(
      (await storedContents(client, "chat-s")).sort(),
      ["Hello!", "Hi, how can I help?", FACT, answer].sort(),
    );
    assert.equal((await client.waitForJob(turn.jobId ?? "")).status, "succeeded");

    const second = streaming(() => convertArrayToReadableStream(answerParts("At Globex.") as never[]));
    const next = streamText({
      model: wrapLanguageModel({ model: second, middleware }),
      system: SYSTEM,
      prompt: "Where do I work?",
    });
    assert.equal(await next.text, "At Globex.");
    assert.match(systemOf(second.doStreamCalls[0]?.prompt), /What I know about you[\s\S]*Globex/);
    assert.equal(savedTurn(await next.providerMetadata).memoryInjected, true);
  });

  test("history the caller holds goes as placeholder history and is not stored again", async () => {
    const { client } = await freshUser();
    const middleware = contextMemoryMiddleware({ client, chatId: "chat-h", spaceId: SPACE });
    const model = generating("Sure.");
    await generateText({
      model: wrapLanguageModel({ model, middleware }),
      messages: [
        { role: "user", content: "Earlier question" },
        { role: "assistant", content: "Earlier answer" },
        { role: "user", content: "Keep it short." },
      ],
    });
    assert.deepEqual((await storedContents(client, "chat-h")).sort(), ["Keep it short.", "Sure."]);
    const sent = model.doGenerateCalls[0]?.prompt.map((m) => m.role);
    assert.deepEqual(sent, ["user", "assistant", "user"]);
  });

  test("a stream that errors saves nothing", async () => {
    const { client } = await freshUser();
    const middleware = contextMemoryMiddleware({ client, chatId: "chat-x", spaceId: SPACE });
    const parts = answerParts("Half an ans");
    parts.splice(parts.length - 2, 0, { type: "error", error: new Error("the model broke") });
    const model = streaming(() => convertArrayToReadableStream(parts as never[]));
    const errors: unknown[] = [];
    const result = streamText({
      model: wrapLanguageModel({ model, middleware }),
      prompt: FACT,
      onError: ({ error }) => {
        errors.push(error);
      },
    });
    await result.consumeStream();
    assert.equal(errors.length, 1);
    assert.deepEqual(await storedContents(client, "chat-x"), []);
  });

  test("an aborted stream saves nothing", async () => {
    const { client } = await freshUser();
    const middleware = contextMemoryMiddleware({ client, chatId: "chat-a", spaceId: SPACE });
    const controller = new AbortController();
    const model = streaming(
      () =>
        new ReadableStream<never>({
          start(stream) {
            for (const part of answerParts("Never finished").slice(0, 3)) stream.enqueue(part as never);
            // the rest never comes: the caller aborts while waiting for it
          },
        }),
    );
    const result = streamText({
      model: wrapLanguageModel({ model, middleware }),
      prompt: FACT,
      abortSignal: controller.signal,
    });
    let streamed = "";
    for await (const delta of result.textStream) {
      streamed += delta;
      controller.abort();
    }
    assert.equal(streamed, "Never ");
    assert.deepEqual(await storedContents(client, "chat-a"), []);
  });
});

test("a prompt that does not end with the user's message is refused", async () => {
  const { splitPrompt } = await import("context-memory-client/ai-sdk");
  assert.throws(
    () => splitPrompt([{ role: "user", content: [{ type: "text", text: "hi" }] }, { role: "assistant", content: [{ type: "text", text: "hello" }] }]),
    TypeError,
  );
  const split = splitPrompt([
    { role: "system", content: "Be brief." },
    { role: "user", content: [{ type: "text", text: "a" }] },
    { role: "assistant", content: [{ type: "text", text: "b" }] },
    { role: "user", content: [{ type: "text", text: "c" }] },
  ]);
  assert.deepEqual(split, {
    system: "Be brief.",
    placeholderHistory: [
      { role: "user", content: "a" },
      { role: "assistant", content: "b" },
    ],
    messages: [{ role: "user", content: "c" }],
  });
});
