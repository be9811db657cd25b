/** Every TypeScript block of docs/typescript.md (compiled from test/doc-snippets/), run against
 * the service as a fresh user with context memory on. */

import assert from "node:assert/strict";
import { readdirSync } from "node:fs";
import { test } from "node:test";

import { BASE_URL, NO_SERVICE, freshUser } from "./support.js";

const here = new URL("./doc-snippets/", import.meta.url);
const snippets = readdirSync(here).filter((name) => name.endsWith(".js")).sort();

test("docs/typescript.md has its examples", () => {
  assert.ok(snippets.length >= 5, `only ${snippets.length} blocks`);
});

for (const name of snippets) {
  test(`docs/typescript.md block ${name.replace(".js", "")}`, { skip: NO_SERVICE }, async () => {
    const { token } = await freshUser();
    const snippet = (await import(new URL(name, here).href)) as {
      default: (baseUrl: string, token: string) => Promise<void>;
    };
    await snippet.default(BASE_URL, token);
  });
}
