import { Sandbox } from 'e2b'
const sbx = await Sandbox.create({ timeoutMs: 120000, envs: { SBX_ENV: 'x' } })
let fails = 0
const cmds = [['pwd', {cwd:'/tmp'}], ['id -un; id -u', {}], ['id -un; id -u', {user:'root'}], ['echo "$SBX_ENV|$CMD_ENV"', {envs:{CMD_ENV:'c'}}], ['touch /tmp/x', {}], ['stat -c %U /tmp/x', {}]]
for (let i = 0; i < 60; i++) {
  for (const [c, o] of cmds) {
  const t0 = Date.now()
  try { await sbx.commands.run(c, o) } catch (e) { fails++; console.log(new Date().toISOString(), i, c, Date.now()-t0, e.message) }
  }
}
console.log('fails', fails)
await sbx.kill()
