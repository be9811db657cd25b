/**
 * A Vercel AI SDK middleware (`ai` 7, `wrapLanguageModel`) that gives a model the service's
 * memory and history before each call and saves the exchange after it:
 *
 *   const model = wrapLanguageModel({
 *     model: yourModel,
 *     middleware: contextMemoryMiddleware({ client, chatId, spaceId }),
 *   });
 *   const { text } = await generateText({ model, system, messages });
 *
 * `transformParams` sends the prompt to `POST /context` and replaces it with the service's
 * final messages (the system prompt with "What I know about you", history resolved by `mode`).
 * `wrapGenerate` saves the turn with `POST /turns` once the answer is there; `wrapStream` saves it
 * when the stream has finished, holding the `finish` part back until then (a stream that errors
 * or is cancelled saves nothing). Either way the saved turn is in the result's
 * `providerMetadata.contextMemory`.
 *
 * Only `ai`'s types are imported: this module needs no runtime dependency of its own.
 */

import type { LanguageModelMiddleware } from "ai";

import type { ContextMemoryClient } from "./client.js";
import type { ContextResponse, HistoryMode, MessageIn, TurnSaved } from "./types.js";

type TransformParams = NonNullable<LanguageModelMiddleware["transformParams"]>;
type ModelCallOptions = Parameters<TransformParams>[0]["params"];
type Model = Parameters<TransformParams>[0]["model"];
type PromptMessage = ModelCallOptions["prompt"][number];
type StreamResult = Awaited<ReturnType<NonNullable<LanguageModelMiddleware["wrapStream"]>>>;
type StreamPart = StreamResult["stream"] extends ReadableStream<infer P> ? P : never;
type FinishPart = Extract<StreamPart, { type: "finish" }>;
type GenerateResult = Awaited<ReturnType<NonNullable<LanguageModelMiddleware["wrapGenerate"]>>>;

export interface ContextMemoryMiddlewareOptions {
  client: ContextMemoryClient;
  /** The chat this model's calls belong to. */
  chatId: string;
  /** The space the turns run in (what decides whether memory is on). */
  spaceId: string;
  /** The memory mode (`history_mode`) of both calls; default `auto`. */
  mode?: HistoryMode;
  /** The model name recorded with each turn; default the model's id when it is printable ASCII. */
  languageModel?: string | null;
}

/** The turn a call saved, as `providerMetadata.contextMemory` carries it. */
export interface SavedTurnMetadata {
  [key: string]: string | number | boolean | null;
  turnId: string;
  consolidation: TurnSaved["consolidation"]["status"];
  jobId: string | null;
  memoryInjected: boolean;
  memoryVersion: number | null;
}

/** What `transformParams` sent, kept for the turn-save of the same call. */
interface Exchange {
  messages: MessageIn[];
  placeholderHistory: MessageIn[] | null;
  context: ContextResponse;
}

const PRINTABLE_MODEL_NAME = /^[\x21-\x7e]{1,128}$/;

export function contextMemoryMiddleware(
  options: ContextMemoryMiddlewareOptions,
): LanguageModelMiddleware {
  const { client, chatId, spaceId } = options;
  const mode: HistoryMode = options.mode ?? "auto";
  // transformParams hands its result to wrapGenerate/wrapStream as the same object.
  const exchanges = new WeakMap<ModelCallOptions, Exchange>();

  async function save(exchange: Exchange, answer: string, model: Model): Promise<SavedTurnMetadata> {
    const name = options.languageModel === undefined ? model.modelId : options.languageModel;
    const saved = await client.saveTurn(chatId, {
      space_id: spaceId,
      history_mode: mode,
      messages: exchange.messages,
      placeholder_history: exchange.placeholderHistory,
      response: { content: answer },
      language_model: name !== null && PRINTABLE_MODEL_NAME.test(name) ? name : null,
    });
    return {
      turnId: saved.turn_id,
      consolidation: saved.consolidation.status,
      jobId: saved.consolidation.job_id,
      memoryInjected: exchange.context.memory.injected,
      memoryVersion: exchange.context.memory.version,
    };
  }

  return {
    specificationVersion: "v4",

    async transformParams({ params }) {
      const { system, placeholderHistory, messages } = splitPrompt(params.prompt);
      const signal = params.abortSignal;
      const context = await client.loadContext(
        chatId,
        {
          space_id: spaceId,
          history_mode: mode,
          system_prompt: system,
          placeholder_history: placeholderHistory,
          messages,
        },
        signal ? { signal } : {},
      );
      const transformed: ModelCallOptions = { ...params, prompt: context.messages.map(toPrompt) };
      exchanges.set(transformed, { messages, placeholderHistory, context });
      return transformed;
    },

    async wrapGenerate({ doGenerate, params, model }): Promise<GenerateResult> {
      const result = await doGenerate();
      const exchange = exchanges.get(params);
      if (exchange === undefined) return result;
      const answer = result.content.flatMap((part) => (part.type === "text" ? [part.text] : []));
      const turn = await save(exchange, answer.join(""), model);
      return { ...result, providerMetadata: { ...result.providerMetadata, contextMemory: turn } };
    },

    async wrapStream({ doStream, params, model }): Promise<StreamResult> {
      const result = await doStream();
      const exchange = exchanges.get(params);
      if (exchange === undefined) return result;
      let answer = "";
      let failed = false;
      let finish: FinishPart | undefined;
      const saving = new TransformStream<StreamPart, StreamPart>({
        transform(part, controller) {
          if (part.type === "text-delta") answer += part.delta;
          if (part.type === "error") failed = true;
          if (part.type === "finish") finish = part; // sent on flush, with the saved turn
          else controller.enqueue(part);
        },
        async flush(controller) {
          if (finish === undefined) return; // the model never finished: nothing to save
          if (failed || params.abortSignal?.aborted) {
            controller.enqueue(finish);
            return;
          }
          const turn = await save(exchange, answer, model);
          const metadata = { ...finish.providerMetadata, contextMemory: turn };
          controller.enqueue({ ...finish, providerMetadata: metadata });
        },
      });
      return { ...result, stream: result.stream.pipeThrough(saving) };
    },
  };
}

/**
 * The AI SDK prompt as the service's request: the leading system messages as `system_prompt`,
 * the user messages at the end as the current input, and everything between as
 * `placeholder_history` (history the caller already holds, so `auto` does not load it twice).
 */
export function splitPrompt(prompt: readonly PromptMessage[]): {
  system: string | null;
  placeholderHistory: MessageIn[] | null;
  messages: MessageIn[];
} {
  const systems: string[] = [];
  let start = 0;
  while (prompt[start]?.role === "system") systems.push((prompt[start++] as { content: string }).content);
  const conversation = prompt.slice(start).flatMap(toMessageIn);
  let cut = conversation.length;
  while (cut > 0 && conversation[cut - 1]?.role === "user") cut--;
  if (cut === conversation.length || prompt.at(-1)?.role !== "user") {
    throw new TypeError(
      "contextMemoryMiddleware: the prompt must end with the user's message (one model call " +
        "per turn; tool-call steps are not supported)",
    );
  }
  const history = conversation.slice(0, cut);
  return {
    system: systems.length > 0 ? systems.join("\n\n") : null,
    placeholderHistory: history.length > 0 ? history : null,
    messages: conversation.slice(cut),
  };
}

/** One prompt message as the service's text message; tool messages and system messages after
 * the conversation began carry nothing the service stores. */
function toMessageIn(message: PromptMessage): MessageIn[] {
  if (message.role === "system" || message.role === "tool") return [];
  const texts: string[] = [];
  for (const part of message.content) {
    if (part.type === "text") texts.push(part.text);
    else if (part.type === "file") {
      throw new TypeError("contextMemoryMiddleware: the service stores text; a file part cannot go");
    }
  }
  if (message.role === "assistant" && texts.length === 0) return []; // tool calls only
  return [{ role: message.role, content: texts.join("\n") }];
}

function toPrompt(message: ContextResponse["messages"][number]): PromptMessage {
  const content = [{ type: "text" as const, text: message.content }];
  if (message.role === "system") return { role: "system", content: message.content };
  return message.role === "user" ? { role: "user", content } : { role: "assistant", content };
}
