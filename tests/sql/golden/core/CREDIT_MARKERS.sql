SELECT '{outcome}', {nulls}, allowance FROM granted
UNION ALL
SELECT '{until}', {nulls}, (extract(epoch FROM until) * 1e6)::bigint FROM granted
