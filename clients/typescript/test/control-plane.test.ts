/**
 * The control plane's calls against the real service: a company registered, listed and read,
 * its spaces set by its own operator, a user erased on request, and the company offboarded
 * with a receipt that outlives it.
 */

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { describe, test } from "node:test";

import { ContextMemoryClient, NotFound, type CompanyOut } from "context-memory-client";

import { BASE_URL, NO_SERVICE, mintToken } from "./support.js";

function client(sub: string, company: string, roles: string[]): ContextMemoryClient {
  return new ContextMemoryClient({ baseUrl: BASE_URL, token: mintToken(sub, company, roles) });
}

describe("the control plane", { skip: NO_SERVICE }, () => {
  test("a company registered, listed, set by its operator, a user erased, then offboarded", async () => {
    const company = `ts-co-${randomUUID().slice(0, 8)}`;
    const platform = client("olga", "platform", ["operator"]);
    const own = client("cora", company, ["company_operator"]);

    const created = await platform.createCompany({ company_id: company, display_name: "TS Co" });
    assert.equal(created.display_name, "TS Co");
    assert.equal((await platform.createCompany({ company_id: company })).company_id, company);
    const listed: CompanyOut[] = [];
    for await (const item of platform.listCompanies({ pageSize: 1 })) listed.push(item);
    assert.ok(listed.some((item) => item.company_id === company));
    assert.equal((await own.getCompany(company)).origin, "operator");

    const space = await own.setCompanySpace(company, "space-1", { context_memory: false });
    assert.equal(space.context_memory, false);
    assert.deepEqual(await platform.getCompanySpace(company, "space-1"), space);
    const spaces = (await own.listCompanySpacesPage(company)).items.map((item) => item.space_id);
    assert.deepEqual(spaces, ["space-1"]);

    const erased = await own.eraseCompanyUser(company, "nobody");
    assert.equal(erased.user_id, "nobody");
    assert.equal(erased.deleted.turns, 0);

    const receipt = await platform.offboardCompany(company);
    assert.equal(receipt.company_id, company);
    const again = await platform.offboardCompany(company);
    assert.equal(again.offboarding_id, receipt.offboarding_id);
    // the service erases the company after answering: poll its receipt, with a deadline
    const deadline = Date.now() + 10_000;
    let done = await platform.getOffboarding(company);
    while (done.status !== "done" && Date.now() < deadline) {
      await new Promise((resolve) => setTimeout(resolve, 50));
      done = await platform.getOffboarding(company);
    }
    assert.equal(done.status, "done");
    assert.ok(done.erased_rows >= 2, "the registration and the space at least");
    await assert.rejects(platform.getCompany(company), NotFound);
  });
});
