/**
 * `make demo-ts`: the scripted five-turn conversation of `make demo`, through the TypeScript
 * client. Runs against the service at `--url` / `CMS_URL` (default http://127.0.0.1:8000, what
 * `make run` serves). The token is `--token` / `CMS_TOKEN`, or one minted with
 * `python -m app token` for a fresh demo user (with the operator role, so the demo can switch
 * the company's context-memory flag on). After each turn it waits for the consolidation job and
 * prints the profile diff, the "What I know about you" section the next turn will inject, and
 * the version. No network and no key needed without a model configured.
 */

import { execFileSync } from "node:child_process";
import { randomUUID } from "node:crypto";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";

import { ContextMemoryClient, FLAG_CONTEXT_MEMORY, NotFound } from "context-memory-client";

import { memorySection, modelFromEnv, Orchestrator } from "./orchestrator.js";

export const SCRIPT = [
  "Hi! I'm a data engineer at Globex.", // a job
  "I live in Berlin, and I'm working on a migration to dbt.", // a city
  "I prefer concise answers. Please use bullet points when you compare tools.", // preferences
  "Sorry, a correction: I moved to Lisbon last spring. I live in Lisbon now.", // a correction
  "Thanks, that helps! What's a fun fact about octopuses?", // chit-chat: nothing to remember
];
const SPACE_ID = "demo-space";
const PROJECT_ROOT = fileURLToPath(new URL("../../../", import.meta.url));

/** A token from `python -m app token`, signed with the key this checkout configures. */
function mintToken(user: string): string {
  const python = process.env["PYTHON"] ?? `${PROJECT_ROOT}.venv/bin/python`;
  const args = ["-m", "app", "token", "--sub", user, "--company", "demo"];
  args.push("--role", "operator", "--role", "space_admin");
  return execFileSync(python, args, { cwd: PROJECT_ROOT, encoding: "utf8" }).trim();
}

/** Switch the company's context-memory flag on when that is what keeps memory off. */
async function ensureEnabled(memory: ContextMemoryClient, company: string): Promise<void> {
  let decision = await memory.getEnablement(SPACE_ID);
  const blocked = decision.conditions.filter((c) => !c.satisfied).map((c) => c.key);
  if (!decision.enabled && blocked.length === 1 && blocked[0] === "company_flag") {
    await memory.setFeatureFlag(company, FLAG_CONTEXT_MEMORY, true);
    console.log(`Switched ${FLAG_CONTEXT_MEMORY} on for company '${company}'.`);
    decision = await memory.getEnablement(SPACE_ID);
  }
  if (!decision.enabled) {
    throw new Error(`Context memory is off for this user in '${SPACE_ID}': ${decision.reason}`);
  }
}

async function profileVersion(memory: ContextMemoryClient): Promise<number | null> {
  try {
    return (await memory.getMemory()).version;
  } catch (error) {
    if (error instanceof NotFound) return null;
    throw error;
  }
}

/** The bullets removed (`- ...`) and added (`+ ...`) from `before` (null: the empty document). */
async function profileDiff(memory: ContextMemoryClient, version: number, before: number | null): Promise<string[]> {
  const { diff } = await memory.diffVersions(version, { against: before ?? 0 });
  return diff
    .split("\n")
    .filter((line) => line.startsWith("+- ") || line.startsWith("-- "))
    .map((line) => `${line[0]} ${line.slice(3)}`);
}

/** What the next turn's model call will be told: a context call that saves nothing. */
async function injectedSection(memory: ContextMemoryClient, chatId: string): Promise<string | null> {
  const preview = await memory.loadContext(chatId, {
    space_id: SPACE_ID,
    history_mode: "never",
    system_prompt: "(preview)",
    messages: [{ role: "user", content: "(preview)" }],
  });
  return memorySection(preview.system_prompt);
}

export async function runDemo(url: string, token: string): Promise<(number | null)[]> {
  const memory = new ContextMemoryClient({ baseUrl: url, token, timeoutMs: 30_000 });
  const model = modelFromEnv();
  const chatId = `demo-${randomUUID().slice(0, 8)}`;
  const me = await memory.getMe();
  console.log(`User '${me.user_id}' of company '${me.company_id}', chat ${chatId}, model ${model.name}`);
  await ensureEnabled(memory, me.company_id);
  const orchestrator = new Orchestrator(memory, model, SPACE_ID, chatId);
  let version = await profileVersion(memory);
  const versions: (number | null)[] = [];
  for (const [index, text] of SCRIPT.entries()) {
    const before = version;
    const outcome = await orchestrator.runTurn(text);
    const { job_id: jobId, reason } = outcome.saved.consolidation;
    let status = `skipped: ${reason}`;
    if (jobId !== null) {
      const job = await memory.waitForJob(jobId, { timeoutMs: 60_000, pollIntervalMs: 100 });
      status = job.outcome ?? job.status;
    }
    version = await profileVersion(memory);
    versions.push(version);
    const diff = version !== null && version !== before ? await profileDiff(memory, version, before) : [];
    const injected = await injectedSection(memory, chatId);
    console.log(`\n=== Turn ${index + 1}/${SCRIPT.length} ${"=".repeat(60)}`);
    console.log(`user      > ${text}`);
    console.log(`assistant > ${outcome.reply}`);
    console.log(`memory    : consolidation ${status}; profile version ${version}`);
    console.log(diff.length > 0 ? `profile diff:\n${diff.map((l) => `    ${l}`).join("\n")}` : "profile diff: (no change)");
    if (injected === null) {
      console.log("injected next turn: (no memory section yet)");
      continue;
    }
    const [heading, , body] = splitThree(injected);
    console.log(`injected next turn:\n    ${heading}\n    (instructions to the model)`);
    for (const line of body.split("\n")) {
      if (line.trim() && line.trim() !== "_(empty)_") console.log(`    ${line}`);
    }
  }
  console.log(`\n${SCRIPT.length} turns; profile version after each: [${versions.join(", ")}]`);
  return versions;
}

/** heading, instructions, and the rest of the section (Python's `split("\n\n", 2)`). */
function splitThree(section: string): [string, string, string] {
  const [heading = "", instructions = "", ...rest] = section.split("\n\n");
  return [heading, instructions, rest.join("\n\n")];
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: { url: { type: "string" }, token: { type: "string" } },
  });
  const url = (values.url ?? process.env["CMS_URL"] ?? "http://127.0.0.1:8000").replace(/\/+$/, "");
  const token = values.token ?? process.env["CMS_TOKEN"] ?? mintToken(`demo-${randomUUID().slice(0, 6)}`);
  await runDemo(url, token);
}

await main();
