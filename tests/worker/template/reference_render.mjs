// Reference renderer for the chat-template parity tests: @huggingface/jinja (the Jinja
// implementation transformers.js uses), installed from npm at the repository root.
//
//   node reference_render.mjs TEMPLATE_FILE CONTEXT_JSON_FILE
//       prints the rendered string to stdout (no trailing newline added); on a template
//       error prints it to stderr and exits 1.
//   node reference_render.mjs --batch JOBS_JSON_FILE
//       JOBS: [{"template_file": path, "context": {...}}, ...]; prints a JSON array of
//       {"ok": true, "text": "..."} or {"ok": false, "error": "..."} in job order.
import { readFileSync } from "node:fs";
import { Template } from "@huggingface/jinja";

function render(templateSource, context) {
  try {
    return { ok: true, text: new Template(templateSource).render(context) };
  } catch (e) {
    return { ok: false, error: String(e && e.message ? e.message : e) };
  }
}

const args = process.argv.slice(2);
if (args[0] === "--batch" && args.length === 2) {
  const jobs = JSON.parse(readFileSync(args[1], "utf8"));
  const cache = new Map();
  const results = jobs.map((job) => {
    let source = job.template;
    if (source === undefined) {
      if (!cache.has(job.template_file)) cache.set(job.template_file, readFileSync(job.template_file, "utf8"));
      source = cache.get(job.template_file);
    }
    return render(source, job.context);
  });
  process.stdout.write(JSON.stringify(results));
} else if (args.length === 2) {
  const r = render(readFileSync(args[0], "utf8"), JSON.parse(readFileSync(args[1], "utf8")));
  if (!r.ok) {
    process.stderr.write(r.error + "\n");
    process.exit(1);
  }
  process.stdout.write(r.text);
} else {
  process.stderr.write("usage: node reference_render.mjs TEMPLATE_FILE CONTEXT_JSON_FILE\n" +
                       "       node reference_render.mjs --batch JOBS_JSON_FILE\n");
  process.exit(2);
}
