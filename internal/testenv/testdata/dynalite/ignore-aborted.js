// Preloaded by testenv (node --require) before dynalite's cli.js. dynalite
// 4.0.0 throws from each request's 'error' listener (index.js:
// req.on('error', function (err) { throw err })), so a client that hangs
// up on a request in flight (a cancelled context, a timeout) crashed the
// whole server. A real DynamoDB shrugs that off: so does this one.
process.on('uncaughtException', function (err) {
  if (err && err.code === 'ECONNRESET') return
  console.error(err)
  process.exit(1)
})
