// OpenCode plugin: evidence from the Knowledge Service in front of each prompt.
//
// On `chat.message` it runs `knowledge-hook --format text` (the same command the Claude Code and
// Codex hooks run) with the prompt as a UserPromptSubmit event on stdin, and adds the compact
// evidence block it prints (ids and path:start-end, never whole files) to the message as a
// synthetic text part. A hard time limit (KNOWLEDGE_HOOK_TIMEOUT seconds, default 2, plus one
// second to start the command) bounds the wait; when the service is down, slow or finds
// nothing, the hook prints nothing and the prompt goes on unchanged.
//
// KNOWLEDGE_HOOK_COMMAND overrides the command (split on spaces), e.g.
// "python -m knowledge_mcp.hooks" where only the bridge's source tree is available.
import { execFile } from "node:child_process"

const COMMAND = (process.env.KNOWLEDGE_HOOK_COMMAND || "knowledge-hook").split(" ").filter(Boolean)
const LIMIT_MS = Math.round(1000 * (Number(process.env.KNOWLEDGE_HOOK_TIMEOUT) || 2)) + 1000

function evidence(event) {
  return new Promise((resolve) => {
    let child
    try {
      child = execFile(
        COMMAND[0],
        [...COMMAND.slice(1), "--format", "text"],
        { timeout: LIMIT_MS, maxBuffer: 1 << 16, killSignal: "SIGKILL" },
        (err, stdout) => resolve(err ? "" : String(stdout).trim()),
      )
    } catch {
      resolve("")
      return
    }
    child.on("error", () => resolve(""))
    child.stdin.on("error", () => {})
    child.stdin.end(JSON.stringify(event))
  })
}

export const KnowledgePlugin = async ({ directory }) => ({
  "chat.message": async (_input, output) => {
    const prompt = output.parts.find((p) => p.type === "text" && !p.synthetic)
    if (!prompt || !prompt.text) return
    const block = await evidence({ hook_event_name: "UserPromptSubmit", prompt: prompt.text, cwd: directory })
    if (!block) return
    output.parts.push({ ...prompt, id: `${prompt.id}k`, text: block, synthetic: true })
  },
})
