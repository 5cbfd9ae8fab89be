// What the browser pages (page.js, chain-page.ts) share: a fetch that counts what each party
// is sent and, asked to, plays a lying party B (a byte of every query answer flipped before
// the client sees it), and the tables a page shows its steps and those counts in.

export interface Seen {
  requests: number;
  bytes: number;
}

export type Step = { ok: true; value: unknown; ms: number } | { ok: false; error: string; code: number | null; ms: number };

function flipped(obj: { pages?: unknown[]; results?: { pages?: unknown[] }[] }): unknown {
  const pages = obj.pages ?? obj.results?.[0]?.pages;
  if (pages?.length) {
    const p = pages[0];
    if (typeof p === "string") pages[0] = p.slice(0, 40) + (p[40] === "0" ? "1" : "0") + p.slice(41);
    else (p as Uint8Array)[20]! ^= 1;
  }
  return obj;
}

/** A fetch for the client to `a` and `b` that counts each party's requests and bytes sent,
 * and with `lie` changes party B's query answers. */
export function watchedFetch(b: string, lie: boolean): { fetch: typeof fetch; seen: Record<"A" | "B", Seen> } {
  const seen = { A: { requests: 0, bytes: 0 }, B: { requests: 0, bytes: 0 } };
  const watched = async (input: RequestInfo | URL, init: RequestInit = {}) => {
    const who = String(input).startsWith(b) ? "B" : "A";
    seen[who].requests += 1;
    seen[who].bytes += (init.body as { length?: number } | undefined)?.length ?? 0;
    const resp = await fetch(input, init);
    if (who !== "B" || !lie || init.method !== "POST" || !resp.ok) return resp;
    const type = resp.headers.get("content-type") ?? "";
    if (type.includes("json")) {
      return new Response(JSON.stringify(flipped(await resp.json())), { status: resp.status, headers: resp.headers });
    }
    const body = new Uint8Array(await resp.arrayBuffer());
    body[body.length - 4000]! ^= 1; // near the start of the last page of the msgpack answer
    return new Response(body, { status: resp.status, headers: resp.headers });
  };
  return { fetch: watched as typeof fetch, seen };
}

/** Runs and shows the page's steps: `step(name, fn)` times `fn`, keeps its answer or its
 * error in `steps`, and adds a row to #steps and the parties' counts to #seen. */
export function stepper(seen: Record<string, Seen>): { steps: Record<string, Step>; step: (name: string, fn: () => Promise<unknown>) => Promise<void> } {
  const steps: Record<string, Step> = {};
  const show = (name: string, s: Step) => {
    const tr = document.createElement("tr");
    const answer = s.ok ? JSON.stringify(s.value, (_, v) => (typeof v === "bigint" ? v.toString() : v)) : `refused: ${s.error}`;
    tr.innerHTML = "<td></td><td class=value></td><td></td>";
    tr.children[0]!.textContent = name;
    tr.children[1]!.textContent = answer.length > 300 ? answer.slice(0, 300) + "..." : answer;
    tr.children[1]!.className = "value " + (s.ok ? "ok" : "refused");
    tr.children[2]!.textContent = s.ms.toFixed(1);
    document.getElementById("steps")!.appendChild(tr);
    const table = document.getElementById("seen")!;
    table.innerHTML = "";
    for (const [who, c] of Object.entries(seen)) {
      const r = document.createElement("tr");
      r.innerHTML = `<td>${who}</td><td>${c.requests}</td><td>${c.bytes}</td>`;
      table.appendChild(r);
    }
  };
  const step = async (name: string, fn: () => Promise<unknown>) => {
    const t0 = performance.now();
    let s: Step;
    try {
      const value = await fn();
      s = { ok: true, value: typeof value === "bigint" ? value.toString() : value, ms: 0 };
    } catch (e) {
      const err = e as { name?: string; message?: string; code?: number };
      s = { ok: false, error: `${err.name}: ${err.message}`, code: err.code ?? null, ms: 0 };
    }
    s.ms = performance.now() - t0;
    steps[name] = s;
    show(name, s);
  };
  return { steps, step };
}
