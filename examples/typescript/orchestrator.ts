/**
 * An orchestrator's chat turn over the Context Memory Service, in TypeScript: context → model →
 * turn-save, through the typed client (`context-memory-client`). The model is any
 * OpenAI-compatible chat completions endpoint, called with `fetch` (`OPENAI_BASE_URL`,
 * `OPENAI_API_KEY`, `DEMO_MODEL`); with none configured a canned reply stands in, so the loop
 * runs offline and memory still appears (the service's offline engine consolidates it).
 */

import type { ContextMemoryClient, ContextResponse, MessageOut, TurnSaved } from "context-memory-client";

export const SYSTEM_PROMPT = "You are a helpful assistant. Answer briefly.";
export const MEMORY_SECTION = "## What I know about you";
const DEFAULT_MODEL = "gpt-4o-mini";

/** What the orchestrator needs of a model: the final message list in, the answer out. */
export interface ChatModel {
  readonly name: string;
  answer(messages: readonly MessageOut[]): Promise<string>;
}

/** Any OpenAI-compatible chat completions endpoint, over `fetch`. */
export class OpenAICompatibleModel implements ChatModel {
  constructor(
    readonly name: string,
    private readonly baseUrl: string,
    private readonly apiKey: string | undefined,
  ) {}

  async answer(messages: readonly MessageOut[]): Promise<string> {
    const response = await fetch(`${this.baseUrl.replace(/\/+$/, "")}/chat/completions`, {
      method: "POST",
      headers: {
        "Content-Type": "application/json",
        // a local server often needs no key; some insist on the header all the same
        Authorization: `Bearer ${this.apiKey ?? "not-needed"}`,
      },
      body: JSON.stringify({ model: this.name, messages }),
      signal: AbortSignal.timeout(120_000),
    });
    if (!response.ok) throw new Error(`the model answered ${response.status}: ${await response.text()}`);
    const completion = (await response.json()) as { choices: { message: { content: string | null } }[] };
    return completion.choices[0]?.message.content ?? "";
  }
}

/** No model configured: a fixed, honest reply that shows what the model would have seen. */
export class CannedModel implements ChatModel {
  readonly name = "canned-reply";

  async answer(messages: readonly MessageOut[]): Promise<string> {
    const system = messages.find((m) => m.role === "system")?.content ?? "";
    const knows = system.includes(MEMORY_SECTION) ? "with" : "without";
    const earlier = messages.filter((m) => m.role !== "system").length - 1;
    return (
      `(canned reply: no model configured) I got your message ${knows} a memory section ` +
      `and ${earlier} earlier message(s) of this chat.`
    );
  }
}

/** The OpenAI-compatible model when `OPENAI_BASE_URL` or `OPENAI_API_KEY` is set, else the
 * canned reply. */
export function modelFromEnv(env: NodeJS.ProcessEnv = process.env): ChatModel {
  const baseUrl = env["OPENAI_BASE_URL"];
  const apiKey = env["OPENAI_API_KEY"];
  if (!baseUrl && !apiKey) return new CannedModel();
  return new OpenAICompatibleModel(
    env["DEMO_MODEL"] ?? DEFAULT_MODEL,
    baseUrl ?? "https://api.openai.com/v1",
    apiKey,
  );
}

/** What one turn did: the context the model got, its answer, and the saved turn. */
export interface TurnOutcome {
  context: ContextResponse;
  reply: string;
  saved: TurnSaved;
}

/** One chat of one user: each `runTurn` makes the service's two calls around the model. */
export class Orchestrator {
  constructor(
    readonly memory: ContextMemoryClient,
    readonly model: ChatModel,
    readonly spaceId: string,
    readonly chatId: string,
  ) {}

  async runTurn(userText: string): Promise<TurnOutcome> {
    const current = [{ role: "user" as const, content: userText }];
    // 1. Load and inject: memory in the system prompt, stored history resolved by mode.
    const context = await this.memory.loadContext(this.chatId, {
      space_id: this.spaceId,
      system_prompt: SYSTEM_PROMPT,
      messages: current,
    });
    // 2. The model call, on exactly the messages the service composed.
    const reply = await this.model.answer(context.messages);
    // 3. Turn-save: the same input and the answer; memory is consolidated in the background.
    // The client sends one Idempotency-Key with every attempt: a retry saves nothing twice.
    const saved = await this.memory.saveTurn(this.chatId, {
      space_id: this.spaceId,
      messages: current,
      response: { content: reply },
      language_model: this.model.name,
    });
    return { context, reply, saved };
  }
}

/** The injected "What I know about you" section of a composed system prompt, if any. */
export function memorySection(systemPrompt: string | null): string | null {
  const at = systemPrompt?.indexOf(MEMORY_SECTION) ?? -1;
  return systemPrompt && at >= 0 ? systemPrompt.slice(at) : null;
}
