"""Test helpers shipped with the suite (not fakes of trialbus code).

event_builders.py   one TrialFailed / ResultImported with test defaults, so a test names
                    only the fields it is about (golden instances: sample_events.py)
model_stub.py       an OpenAI-compatible model server on a loopback port, scripted
                    per model name, for end-to-end tests of real LLM agents offline
probe_agent.py      a Harbor agent that reports and then changes process-wide state,
                    for the per-trial isolation tests
sandbox_env.py      LocalEnvironment fixtures (make_env, running, sh) for the local
                    environment's integration and security tests
"""
