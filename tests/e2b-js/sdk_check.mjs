// E2B's JavaScript SDKs against `agentos e2b`, unmodified: each check runs
// a documented use and prints one JSON line, {"check": name, "ok": bool,
// "detail": ...}; the Python test that starts this reads them. The face's
// address and two keys come from the environment (E2B_API_URL,
// E2B_SANDBOX_URL, E2B_API_KEY, OTHER_E2B_API_KEY).
import { Sandbox as CodeSandbox } from '@e2b/code-interpreter'
import { Sandbox } from 'e2b'

const report = (check, ok, detail) =>
  console.log(JSON.stringify({ check, ok: Boolean(ok), detail }))

async function check(name, run) {
  try {
    const detail = await run()
    report(name, true, detail)
  } catch (err) {
    report(name, false, String(err && err.stack ? err.stack : err))
  }
}

const other = process.env.OTHER_E2B_API_KEY
const sandbox = await Sandbox.create({ metadata: { from: 'js' }, timeoutMs: 120_000 })
try {
  await check('create and info', async () => {
    const info = await sandbox.getInfo()
    if (info.metadata.from !== 'js' || info.state !== 'running') throw new Error(JSON.stringify(info))
    return info.sandboxId
  })
  await check('commands', async () => {
    const result = await sandbox.commands.run('echo hi; echo err >&2')
    if (result.stdout !== 'hi\n' || result.stderr !== 'err\n') throw new Error(JSON.stringify(result))
    try {
      await sandbox.commands.run('exit 3')
      throw new Error('exit 3 did not throw')
    } catch (err) {
      if (err.exitCode !== 3) throw err
    }
    return result.stdout
  })
  await check('a background server reached by a later command', async () => {
    const server = await sandbox.commands.run('python3 -m http.server 8124', { background: true, timeoutMs: 0 })
    const fetched = await sandbox.commands.run(
      'for i in $(seq 50); do python3 -c "import urllib.request;' +
      "print(urllib.request.urlopen('http://localhost:8124').status)\" 2>/dev/null && exit 0; sleep 0.1; done; exit 1")
    await server.kill()
    if (fetched.stdout.trim() !== '200') throw new Error(fetched.stdout)
    return fetched.stdout.trim()
  })
  await check('files and watch', async () => {
    await sandbox.files.makeDir('watched')
    const events = []
    const watcher = await sandbox.files.watchDir('watched', (event) => events.push(event), { recursive: true })
    await sandbox.files.write('watched/a.txt', 'from js')
    const text = await sandbox.files.read('watched/a.txt')
    const names = (await sandbox.files.list('watched')).map((entry) => entry.name)
    for (let i = 0; i < 50 && !events.some((e) => e.name === 'a.txt'); i++) {
      await new Promise((resolve) => setTimeout(resolve, 100))
    }
    await watcher.stop()
    if (text !== 'from js' || !names.includes('a.txt')) throw new Error(`${text} ${names}`)
    if (!events.some((e) => e.name === 'a.txt')) throw new Error(JSON.stringify(events))
    return events.map((e) => `${e.type}:${e.name}`)
  })
  await check('another key sees nothing of it', async () => {
    const listed = await Sandbox.list({ apiKey: other }).nextItems()
    if (listed.some((s) => s.sandboxId === sandbox.sandboxId)) throw new Error('listed')
    const killed = await Sandbox.kill(sandbox.sandboxId, { apiKey: other })
    if (killed !== false) throw new Error('killed by another key')
    return listed.length
  })
  await check('pause and connect', async () => {
    await sandbox.pause()
    const paused = (await sandbox.getInfo()).state
    const again = await Sandbox.connect(sandbox.sandboxId)
    const result = await again.commands.run('echo back')
    if (paused !== 'paused' || result.stdout !== 'back\n') throw new Error(`${paused} ${result.stdout}`)
    return paused
  })
  await check('metrics', async () => {
    const [metric, ...more] = await sandbox.getMetrics()
    if (!metric || more.length || !(metric.memUsed > 0) || metric.cpuCount !== 2) {
      throw new Error(JSON.stringify(metric))
    }
    return metric.memUsed
  })
  await check('timeout', async () => {
    await sandbox.setTimeout(60_000)
    const info = await sandbox.getInfo()
    const left = new Date(info.endAt).getTime() - Date.now()
    if (left < 50_000 || left > 61_000) throw new Error(String(left))
    return left
  })
} finally {
  await sandbox.kill()
}

await check('code interpreter', async () => {
  const code = await CodeSandbox.create('base')
  try {
    const execution = await code.runCode("x = 6\nprint('seen')\nx * 7")
    if (execution.text !== '42' || execution.logs.stdout[0] !== 'seen\n') {
      throw new Error(JSON.stringify(execution))
    }
    const failed = await code.runCode('1/0')
    if (failed.error.name !== 'ZeroDivisionError') throw new Error(JSON.stringify(failed.error))
    await code.runCode('WORD=kept', { language: 'bash' })
    const bash = await code.runCode('echo $WORD', { language: 'bash' })
    if (bash.logs.stdout.join('') !== 'kept\n') throw new Error(JSON.stringify(bash))
    return execution.text
  } finally {
    await code.kill()
  }
})
